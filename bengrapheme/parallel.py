"""Devices: jax.distributed start-up, the mesh, shardings, and global batches.

The mesh has two axes: `data` (pure data parallelism) and `fsdp` (data parallelism whose
replicas also split the parameters and optimizer state, as in maxtext). Batches are split
over both axes; parameters are replicated, or split along `fsdp` by `param_sharding`.
"""
import collections
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from bengrapheme import errors

BATCH_AXES = ('data', 'fsdp')


def initialize_distributed():
  """Joins a multi-process job when the environment describes one.

  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID name the job explicitly (the
  local launcher, launch/local.py, and hand-made clusters); a SLURM step of several tasks is
  detected by jax; BENGRAPHEME_DISTRIBUTED=auto asks jax to detect any other cluster it
  knows (launch/tpu_pod.sh sets it: a TPU VM pod). Must run before anything touches a device.
  """
  # A dead peer must end the job, not hang it: the others fail within ~this bound.
  timeout = int(os.environ.get('JAX_HEARTBEAT_TIMEOUT', 30))
  if os.environ.get('JAX_COORDINATOR_ADDRESS'):
    # CPU collectives default to gloo in the pinned jax: the local launcher needs no more.
    jax.distributed.initialize(
        coordinator_address=os.environ['JAX_COORDINATOR_ADDRESS'],
        num_processes=int(os.environ['JAX_NUM_PROCESSES']),
        process_id=int(os.environ['JAX_PROCESS_ID']), heartbeat_timeout_seconds=timeout)
  elif (os.environ.get('BENGRAPHEME_DISTRIBUTED') == 'auto' or
        ('SLURM_STEP_NODELIST' in os.environ and int(os.environ.get('SLURM_NTASKS', '1')) > 1)):
    jax.distributed.initialize(heartbeat_timeout_seconds=timeout)
  else:
    return
  if jax.default_backend() == 'cpu' and jax.process_count() > 1:
    connect_collectives()


# How far apart (seconds) the processes of a job may reach connect_collectives.
CONNECT_TIMEOUT_S = 300


def connect_collectives():
  """Connects the processes' CPU collectives (gloo) while every process waits for it.

  gloo connects a group of devices at the first collective over that group, and gives the
  processes 30 s to all get there, a timeout jax does not expose. Processes that reach it
  further apart all fail there ('Gloo context initialization failed: DEADLINE_EXCEEDED:
  GetKeyValue() timed out', 'Connect timeout'), and the one that fails first then fails the
  job's shutdown barrier, which aborts every process (SIGABRT): on a loaded machine one
  process of launch.index compiled its model init for 2 min while the other was already at
  Orbax's first sync. Here the processes compile the two kinds of collective the project runs
  (multihost_utils' gathers, over the devices of each local index, and reductions over all
  devices), wait for each other at a barrier of the coordination service (CONNECT_TIMEOUT_S),
  then run them together; later collectives over the same groups reuse the connections and
  wait for each other as long as it takes.
  """
  from jax._src import distributed  # the job's coordination client; jax has no public name
  devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
  # As multihost_utils.process_allgather lays out what it gathers.
  by_process = jax.sharding.Mesh(devices, ('processes', 'local'))
  index = jax.make_array_from_process_local_data(NamedSharding(by_process, P('processes')),
                                                 np.full(1, jax.process_index(), np.int32))
  gather = jax.jit(lambda x: x, out_shardings=NamedSharding(by_process, P())).lower(index)
  everywhere = jax.sharding.Mesh(devices.reshape(-1), ('all',))
  ones = jax.make_array_from_process_local_data(NamedSharding(everywhere, P('all')),
                                                np.ones(jax.local_device_count(), np.int32))
  count = jax.jit(jnp.sum, out_shardings=NamedSharding(everywhere, P())).lower(ones)
  gather, count = gather.compile(), count.compile()
  distributed.global_state.client.wait_at_barrier('bengrapheme: connect collectives',
                                                  CONNECT_TIMEOUT_S * 1000)
  gathered, total = np.asarray(gather(index).addressable_data(0)), int(count(ones))
  if gathered.tolist() != list(range(jax.process_count())) or total != jax.device_count():
    raise RuntimeError(f'connecting the collectives: gathered {gathered.tolist()} and counted '
                       f'{total} devices; expected each process index and '
                       f'{jax.device_count()}')


def mesh_shape(mesh_config, devices):
  """(data, fsdp): `mesh_config.fsdp` devices per fsdp group, `data` the rest (-1) or a
  given count; errors.ConfigError unless they make up the `devices` available."""
  fsdp = mesh_config.fsdp
  data = mesh_config.data if mesh_config.data > 0 else devices // fsdp
  if data * fsdp != devices:
    raise errors.ConfigError(
        f'mesh.data={mesh_config.data} x mesh.fsdp={fsdp}: expected {devices} devices, those '
        'available (mesh.data=-1 takes what fsdp leaves)')
  return data, fsdp


def check_batch(batch_size, devices, accum=1):
  """errors.ConfigError unless `batch_size` splits evenly over the `devices` of the batch
  axes, each device's rows into `accum` micro-batches."""
  if batch_size % devices:
    raise errors.ConfigError(f'train.batch_size={batch_size}: expected a multiple of the '
                             f'{devices} devices of the batch axes (each takes an equal share)')
  if batch_size // devices % accum:
    raise errors.ConfigError(
        f'train.grad_accum_steps={accum}: expected a divisor of the {batch_size // devices} '
        f'rows of each device (train.batch_size={batch_size} over {devices} devices), so that '
        'every micro-batch keeps its rows on their device')


def make_mesh(mesh_config):
  data, fsdp = mesh_shape(mesh_config, jax.device_count())
  # Auto axes: XLA propagates shardings through the model, so model code needs no annotations.
  return jax.make_mesh((data, fsdp), ('data', 'fsdp'),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def batch_sharding(mesh):
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh):
  return NamedSharding(mesh, P())


def param_sharding(mesh, tree, min_size=2**14):
  """Splits each large array along its largest dimension divisible by the fsdp size."""
  n = mesh.shape['fsdp']

  def spec(x):
    if n == 1 or x.size < min_size:
      return replicated(mesh)
    dims = sorted(range(x.ndim), key=lambda d: -x.shape[d])
    for d in dims:
      if x.shape[d] % n == 0:
        return NamedSharding(mesh, P(*[('fsdp' if i == d else None) for i in range(x.ndim)]))
    return replicated(mesh)

  return jax.tree.map(spec, tree)


def global_batch(mesh, local_batch):
  """Per-process numpy batch -> one global jax.Array sharded along the batch axes."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)


def per_process_batch(global_batch_size, mesh):
  check_batch(global_batch_size, mesh.shape['data'] * mesh.shape['fsdp'])
  return global_batch_size // jax.process_count()


class InFlight:
  """Keeps at most `limit` dispatched computations ahead of the one the host waits for.

  Dispatch is asynchronous: unchecked, the host runs ahead of the devices, and the inputs of
  every step not yet computed pile up in memory (a whole eval split's images; a log
  interval's batches). A couple in flight keep the devices busy.
  """

  def __init__(self, limit=2):
    self.limit, self._pending = limit, collections.deque()

  def push(self, outputs):
    """Adds a step's outputs; waits for the oldest when more than `limit` are pending."""
    self._pending.append(outputs)
    if len(self._pending) > self.limit:
      jax.block_until_ready(self._pending.popleft())


def compiler_options():
  """XLA options for the jitted model steps (train, evaluation). XLA:CPU runs its YNNPACK
  convolutions on one thread; without them convolutions go to Eigen, which uses every core
  (a 1.2x faster train step on 2 cores, bench/train_step.py). Dots and reductions stay in
  YNNPACK. None elsewhere."""
  if jax.default_backend() != 'cpu':
    return None
  return {'xla_cpu_experimental_ynn_fusion_type':
          'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE'}
