"""The launchers without a cluster: script syntax, dry-run commands, and launch.local's
process handling on a stand-in module (no jax, so each case takes about a second)."""
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

SCRIPTS = ('launch/tpu_pod.sh', 'launch/slurm.sbatch')

JOB = '''
import os, sys, time
i = int(os.environ['JAX_PROCESS_ID'])
print(f"id={i} of={os.environ['JAX_NUM_PROCESSES']} at={os.environ['JAX_COORDINATOR_ADDRESS']} "
      f"platforms={os.environ['JAX_PLATFORMS']} xla={os.environ['XLA_FLAGS']}", flush=True)
mode = sys.argv[1]
if mode == 'fail' and i == 1:
  sys.exit(3)
if mode in ('fail', 'sleep'):
  time.sleep(120)
if mode == 'cascade':  # the highest index fails first, the others each 40 ms later
  n = int(os.environ['JAX_NUM_PROCESSES'])
  time.sleep(max(float(sys.argv[2]) + 0.04 * (n - 1 - i) - time.time(), 0))
  sys.exit(10 + i)
'''


def dry_run(script, *args, **env):
  result = subprocess.run(['bash', script, *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, DRY_RUN='1', **env), timeout=30)
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize('script', SCRIPTS)
def test_scripts_parse(script):
  subprocess.run(['bash', '-n', script], cwd=ROOT, check=True)


def test_tpu_pod_dry_run():
  train = ['--config', 'configs/grapheme.py:kaggle', '--data', '/data/bengali ai',
           '--workdir', 'gs://bucket/run']
  tar, scp, setup, run = dry_run('launch/tpu_pod.sh', 'pod', 'us-central2-b', *train,
                                 PROJECT='proj')
  assert tar[:2] == ['tar', 'czf'] and '--exclude=./.venv' in tar
  where = ['--zone', 'us-central2-b', '--worker=all', '--project', 'proj']
  assert scp == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp', tar[2],
                 'pod:bengrapheme-code.tgz', *where]
  assert setup[:10] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'pod', *where[:4]]
  assert "'jax[tpu]==0.10.2' gcsfs" in setup[-1]
  assert run[:-1] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'pod', *where, '--command']
  # The remote shell sees the train arguments intact (the space in the data path included).
  remote = shlex.split(run[-1])
  assert remote[:4] == ['cd', 'bengrapheme', '&&', 'BENGRAPHEME_DISTRIBUTED=auto']
  assert remote[4:] == ['.venv/bin/python', '-m', 'launch.train', *train,
                        '--config.data.cache_dir=/tmp/bengrapheme-prepared']
  # A rerun on a pod already set up only trains.
  assert len(dry_run('launch/tpu_pod.sh', 'pod', 'zone', *train, SKIP_SETUP='1')) == 1


def test_slurm_dry_run():
  train = ['--config', 'configs/grapheme.py:kaggle', '--workdir', '/shared/my run']
  [command] = dry_run('launch/slurm.sbatch', *train)
  assert command == ['srun', '--kill-on-bad-exit=1', '--unbuffered', '--cpus-per-task=8',
                     '.venv/bin/python', '-m', 'launch.train', *train,
                     '--config.data.cache_dir=/tmp/bengrapheme-prepared']
  # One task per node: it must be told to drive all of the node's GPUs.
  export, srun = dry_run('launch/slurm.sbatch', *train, SLURM_NTASKS_PER_NODE='1',
                         SLURM_GPUS_ON_NODE='4')
  assert export == ['export', 'JAX_LOCAL_DEVICE_IDS=0,1,2,3'] and srun == command


def launcher(tmp_path, *args, **popen):
  (tmp_path / 'fake_job.py').write_text(JOB)
  env = dict(os.environ, PYTHONPATH=f'{ROOT}{os.pathsep}{tmp_path}')
  return subprocess.Popen([sys.executable, '-m', 'launch.local', *map(str, args)], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **popen)


def test_local_sets_up_each_process(tmp_path):
  proc = launcher(tmp_path, '--processes', 3, '--devices-per-process', 2, '--', 'fake_job', 'ok')
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert 'all 3 processes succeeded' in err
  lines = sorted(out.splitlines())
  port = re.search(r'at=127\.0\.0\.1:(\d+)', lines[0]).group(1)
  assert lines == [f'[{i}] id={i} of=3 at=127.0.0.1:{port} platforms=cpu '
                   f'xla=--xla_force_host_platform_device_count=2' for i in range(3)]


def test_local_failure_stops_the_others(tmp_path):
  start = time.monotonic()
  proc = launcher(tmp_path, '--processes', 2, '--grace', 1, '--', 'fake_job', 'fail')
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 1
  assert time.monotonic() - start < 30  # not the 120 s process 0 would sleep
  assert '[local] process 1 exited with status 3' in err
  assert 'FAILED: process 1 failed first (exited with status 3)' in err
  assert 'terminated by the launcher: [0]' in err


def test_local_names_failures_in_the_order_they_happened(tmp_path):
  """Processes that fail within one poll of each other (one killed takes its peers down in
  milliseconds) are still named in the order they failed, not by index."""
  proc = launcher(tmp_path, '--processes', 4, '--', 'fake_job', 'cascade', time.time() + 3)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 1
  assert 'FAILED: process 3 failed first (exited with status 13); failed: [3, 2, 1, 0], ' \
         'terminated by the launcher: []' in err, err


def test_local_dies_with_its_processes(tmp_path):
  """A launcher killed outright (a CI timeout, say) leaves no process behind."""
  proc = launcher(tmp_path, '--processes', 2, '--', 'fake_job', 'sleep')
  pids = []
  for line in proc.stderr:
    if m := re.match(r'\[local\] process \d pid (\d+)', line):
      pids.append(int(m.group(1)))
    if len(pids) == 2:
      break
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  deadline = time.monotonic() + 20
  while any(alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not any(alive(p) for p in pids)


def alive(pid):
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(')')[-1].split()[0] != 'Z'  # a zombie has already exited
  except FileNotFoundError:
    return False


def test_local_needs_a_module():
  result = subprocess.run([sys.executable, '-m', 'launch.local', '--processes', '2'], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
  assert result.returncode == 2 and 'no module given' in result.stderr
