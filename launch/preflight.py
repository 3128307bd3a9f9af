"""What launch.train checks before a long run: --dry_run (does the step compile, what does it
cost, does it fit) and --feed_check (will the host's input keep the devices busy).

Neither reads a weight file nor writes to the workdir. The dry run reads no data; the feed
check reads the training data through the config's own input pipeline, preparing it in a
temporary folder unless config.data.cache_dir names one (where a prepared copy is reused).
"""
import contextlib
import os
import shutil
import tempfile
import time


def say(line):
  """One line of a report, from process 0 only."""
  from bengrapheme import console
  if console.speaks():
    print(line, flush=True)


def mib(size):
  return f'{size / 2**20:,.1f} MiB'


def global_shapes(local, mesh):
  """The global batch's shapes and shardings, from one process's random batch."""
  import jax
  from bengrapheme import parallel
  count = jax.process_count()
  return {k: jax.ShapeDtypeStruct((v.shape[0] * count, *v.shape[1:]), v.dtype,
                                  sharding=parallel.batch_sharding(mesh))
          for k, v in local.items()}


def host_memory_available():
  """Bytes the host can still give (the kernel's MemAvailable): simulated CPU devices share it."""
  with open('/proc/meminfo') as f:
    fields = dict(line.split(':', 1) for line in f)
  return int(fields['MemAvailable'].split()[0]) * 1024


def memory_per_device():
  """(bytes one device can hold, where that limit comes from)."""
  import jax
  device = jax.local_devices()[0]
  limit = (device.memory_stats() or {}).get('bytes_limit')
  if limit:
    return limit, f'a {device.device_kind} holds {mib(limit)}'
  # A CPU's devices share the host's memory.
  count = jax.local_device_count()
  available = host_memory_available()
  return available // count, f'the host has {mib(available)} available for {count} device(s)'


def dry_run(config, simulated=False):
  """Compiles the trainer's own train step (train.make_train_step) ahead of time for the
  devices here (or `simulated` ones: --dry_run_devices) from shapes alone, prints what it
  costs per device, and runs it once on the task's random_batch where it fits. Exits 1 on a
  NaN/Inf loss."""
  import jax
  import numpy as np
  from bengrapheme import parallel, train
  task = train.load_task(config)
  mesh = parallel.make_mesh(config.mesh)
  local = task.random_batch(config, parallel.per_process_batch(config.train.batch_size, mesh))
  say(f'Dry run: global batch {config.train.batch_size} on {jax.device_count()} '
      f'{"simulated " if simulated else ""}{jax.default_backend()} device(s); per process: ' +
      ', '.join(f'{k} {v.dtype} {list(v.shape)}' for k, v in local.items()))
  if config.model.init_from:
    say(f'Random initialisation: model.init_from ({config.model.init_from}) is not read.')
  graphdef, shapes = train.init_state(config, task, mesh, pretrained=False, abstract=True)
  train_step = train.make_train_step(config, task, graphdef, mesh,
                                     jax.tree.map(lambda x: x.sharding, shapes))
  say(f'Parameters: {sum(x.size for x in jax.tree.leaves(shapes["params"])):,}')

  tick = time.perf_counter()
  compiled = train_step.lower(shapes, global_shapes(local, mesh)).compile()
  say(f'Compiled the train step in {time.perf_counter() - tick:.1f} s.')
  # XLA analyses the program one device runs, on its 1/device_count share of the batch, and
  # counts a loop's body once: with grad_accum_steps, one micro-batch's forward and backward.
  images = config.train.batch_size // config.train.grad_accum_steps / jax.device_count()
  flops = compiled.cost_analysis()['flops']
  say(f'FLOPs per image: {flops / images / 1e9:,.3f} GFLOP (forward + backward + update, '
      f'XLA cost analysis of the compiled step); {flops / 1e9:,.3f} GFLOP per device a step')
  m = compiled.memory_analysis()
  # The donated state's outputs reuse its argument buffers: those bytes count once.
  total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes +
           m.temp_size_in_bytes + m.generated_code_size_in_bytes)
  say(f'Memory per device: {mib(total)} = arguments {mib(m.argument_size_in_bytes)} + outputs '
      f'{mib(m.output_size_in_bytes)} - donated {mib(m.alias_size_in_bytes)} + temporaries '
      f'{mib(m.temp_size_in_bytes)} + generated code {mib(m.generated_code_size_in_bytes)}')

  if simulated:
    say(f'Not run: compiled for {jax.device_count()} simulated devices, not this host\'s. '
        'Nothing written.')
    return
  limit, where = memory_per_device()
  if total > limit:
    # Temporaries (activations kept for the backward pass) grow with the batch; the rest
    # does not.
    fixed = total - m.temp_size_in_bytes
    fitting = int(config.train.batch_size * (limit - fixed) / max(m.temp_size_in_bytes, 1))
    say(f'Not run: it needs {mib(total)} per device and {where}; a global batch of about '
        f'{max(fitting, 0):,} would fit (--config.train.batch_size, or more devices, or '
        'train.grad_accum_steps). Nothing written.')
    return
  _, state = train.init_state(config, task, mesh, pretrained=False)
  tick = time.perf_counter()
  _, scalars = compiled(state, parallel.global_batch(mesh, local))
  loss = float(scalars['loss'])
  if not np.isfinite(loss):
    raise SystemExit(f'Dry run: the step on random data gave a loss of {loss}')
  say(f'One step on random data: loss {loss:.4f} (finite), {time.perf_counter() - tick:.1f} s. '
      'Nothing written.')


# ---------------------------------------------------------------- the feed check


@contextlib.contextmanager
def scratch_workdir():
  """A workdir for the input pipeline's own files (class counts, prepared data unless
  config.data.cache_dir is set), removed afterwards: the feed check writes nothing."""
  folder = tempfile.mkdtemp(prefix='feed_check_')
  try:
    yield folder
  finally:
    shutil.rmtree(folder, ignore_errors=True)


def input_rate(config, task, workdir, local_batch, seconds):
  """(examples/s, host cores busy) of this process's input pipeline alone, after its first
  batch (which prepares the data and starts the threads)."""
  data = iter(task.train_data(config, workdir, local_batch))
  next(data)
  batches = 0
  wall, cpu = time.perf_counter(), time.process_time()
  while time.perf_counter() - wall < seconds:
    next(data)
    batches += 1
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return batches * local_batch / wall, cpu / wall


def step_rate(config, task, mesh, seconds):
  """Examples/s of the whole job's compiled train step alone, on one random batch kept on
  the devices (no input)."""
  import jax
  from bengrapheme import parallel, train
  local = task.random_batch(config, parallel.per_process_batch(config.train.batch_size, mesh))
  batch = parallel.global_batch(mesh, local)
  _, state, train_step = train.state_and_step(config, task, mesh, pretrained=False)
  state, scalars = train_step(state, batch)  # compiles
  jax.block_until_ready(scalars)
  steps, wall = 0, time.perf_counter()
  while time.perf_counter() - wall < seconds:
    state, scalars = train_step(state, batch)
    jax.block_until_ready(scalars)  # one step at a time: each measured, none queued past
    steps += 1
  return steps * config.train.batch_size / (time.perf_counter() - wall)


def feed_check(config, seconds):
  """Measures the input pipeline alone and the train step alone and says which bounds the
  run; on a multi-process job every process reports its own input."""
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  from bengrapheme import console, parallel, train
  task = train.load_task(config)
  task.check_data(config)
  mesh = parallel.make_mesh(config.mesh)
  local_batch = parallel.per_process_batch(config.train.batch_size, mesh)
  cores = len(os.sched_getaffinity(0))
  say(f'Feed check: global batch {config.train.batch_size} on {jax.device_count()} '
      f'{jax.default_backend()} device(s), {jax.process_count()} process(es); {seconds:g} s '
      'of each part alone.')
  with scratch_workdir() as workdir:
    feed, busy = input_rate(config, task, workdir, local_batch, seconds)
  per_device = jax.local_device_count()
  console.say(f'Input (process {jax.process_index()}): {feed:,.1f} examples/s, '
              f'{feed / per_device:,.1f} per local device; {busy:.1f} of {cores} host cores '
              f'busy (input.num_threads={config.input.num_threads})', every_process=True)
  step = step_rate(config, task, mesh, seconds)
  per_host = step / jax.process_count()
  say(f'Train step: {step:,.1f} examples/s, {per_host:,.1f} per process, '
      f'{step / jax.device_count():,.1f} per device')
  # Every process must keep up: the slowest one's input sets the pace of all.
  slowest = float(np.min(multihost_utils.process_allgather(np.float64(feed))))
  if slowest < per_host:
    per_core = slowest / max(busy, 1e-9)
    say(f'Bound by the input: the step could take {per_host / slowest:.2f}x what the '
        f'slowest process reads. To keep the step busy each process must read '
        f'{per_host:,.1f} examples/s: about {per_host / per_core:.1f} cores at this rate per '
        f'core ({per_core:,.1f} examples/s each), or a cheaper input.')
  else:
    say(f'Bound by the train step: the input reads {slowest / per_host:.2f}x what the step '
        'takes.')
  if jax.default_backend() == 'cpu':
    say('On a CPU the step and the input share the host\'s cores: a run is slower than '
        'either alone.')
  say('Nothing written.')
