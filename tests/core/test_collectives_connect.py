"""A process of a multi-process job may reach its first collective long after the others (a
cold compile on a loaded machine): bengrapheme/parallel.py connects the collectives at start,
so that gloo's fixed 30 s to connect is not spent waiting for it."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

LATE_S = 45  # past gloo's 30 s

# Process 1 reaches the job's first collectives LATE_S after process 0: a gather as
# multihost_utils makes it (what Orbax and the index build sync with), then a sum over all
# devices (what a sharded step reduces over).
LATE = f"""
import time
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from bengrapheme import parallel
parallel.initialize_distributed()
if jax.process_index() == 1:
  time.sleep({LATE_S})
multihost_utils.sync_global_devices('first')
mesh = Mesh(np.array(jax.devices()), ('all',))
ones = jax.make_array_from_process_local_data(NamedSharding(mesh, P('all')),
                                              np.ones(jax.local_device_count(), np.int32))
total = int(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(ones))
print('process', jax.process_index(), 'counted', total, 'devices', flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize('devices', [1, 2])
def test_a_process_late_at_its_first_collective_is_waited_for(tmp_path, devices):
  (tmp_path / 'late_first_collective.py').write_text(LATE)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
  result = subprocess.run(
      [sys.executable, '-m', 'launch.local', '--processes', '2', '--devices-per-process',
       str(devices), '--', 'late_first_collective'], cwd=ROOT, env=env, capture_output=True,
      text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  for process in (0, 1):
    assert f'[{process}] process {process} counted {2 * devices} devices' in result.stdout, (
        result.stdout[-3000:])
