"""Trains; rerunning the same command resumes from the newest checkpoint in --workdir.

  python -m launch.train --config configs/grapheme.py:demo --data DATA --workdir DIR

One run at a time owns a workdir: a second one exits at once (status 1) naming the holder.
A full disk stops training with a message naming the workdir and the space left; the
checkpoints already saved stay restorable, and rerunning after freeing space resumes.

Before a long run, --dry_run builds the config's model and train step for the devices here,
compiles it and runs one step on random data of the input's shape; it prints the parameter
count, FLOPs per image, memory per device, compile time and the step's loss, reads no data
and no weight file (random initialisation) and writes nothing (--workdir may be left out):

  python -m launch.train --config configs/grapheme.py:kaggle --dry_run \\
      --config.train.batch_size=8
"""
import time

from absl import flags as absl_flags

from launch import cli, flags

DRY_RUN = absl_flags.DEFINE_bool(
    'dry_run', False, 'Compile the train step for the devices here and run one step on '
    'random data; print the parameter count, FLOPs per image, memory per device, compile '
    'time and loss. Needs no --data, --workdir or weight file; writes nothing.')


def say(line):
  """One line of the dry run's report, from process 0 only."""
  from bengrapheme import console
  if console.speaks():
    print(line, flush=True)


def mib(size):
  return f'{size / 2**20:,.1f} MiB'


def dry_run(config):
  """Compiles the trainer's own train step (train.state_and_step) for the local devices and
  runs it once on the task's random_batch; prints what it costs. Exits 1 on a NaN/Inf loss."""
  import jax
  import numpy as np
  from bengrapheme import parallel, train
  task = train.load_task(config)
  mesh = parallel.make_mesh(config.mesh)
  local = task.random_batch(config, parallel.per_process_batch(config.train.batch_size, mesh))
  say(f'Dry run: global batch {config.train.batch_size} on {jax.device_count()} '
      f'{jax.default_backend()} device(s); per process: ' +
      ', '.join(f'{k} {v.dtype} {list(v.shape)}' for k, v in local.items()))
  if config.model.init_from:
    say(f'Random initialisation: model.init_from ({config.model.init_from}) is not read.')
  _, state, train_step = train.state_and_step(config, task, mesh, pretrained=False)
  batch = parallel.global_batch(mesh, local)
  say(f'Parameters: {sum(x.size for x in jax.tree.leaves(state["params"])):,}')

  tick = time.perf_counter()
  compiled = train_step.lower(state, batch).compile()
  say(f'Compiled the train step in {time.perf_counter() - tick:.1f} s.')
  # XLA analyses the program one device runs, on its 1/device_count share of the batch, and
  # counts a loop's body once: with grad_accum_steps, one micro-batch's forward and backward.
  images = config.train.batch_size // config.train.grad_accum_steps / jax.device_count()
  flops = compiled.cost_analysis()['flops'] / images
  say(f'FLOPs per image: {flops / 1e9:,.3f} GFLOP (forward + backward + update, '
      'XLA cost analysis of the compiled step)')
  m = compiled.memory_analysis()
  # The donated state's outputs reuse its argument buffers: those bytes count once.
  total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes +
           m.temp_size_in_bytes + m.generated_code_size_in_bytes)
  say(f'Memory per device: {mib(total)} = arguments {mib(m.argument_size_in_bytes)} + outputs '
      f'{mib(m.output_size_in_bytes)} - donated {mib(m.alias_size_in_bytes)} + temporaries '
      f'{mib(m.temp_size_in_bytes)} + generated code {mib(m.generated_code_size_in_bytes)}')

  tick = time.perf_counter()
  _, scalars = compiled(state, batch)
  loss = float(scalars['loss'])
  if not np.isfinite(loss):
    raise SystemExit(f'Dry run: the step on random data gave a loss of {loss}')
  say(f'One step on random data: loss {loss:.4f} (finite), {time.perf_counter() - tick:.1f} s. '
      'Nothing written.')


def main(argv):
  del argv
  from bengrapheme import checkpoint, errors, files, train, workdir_lock
  config = flags.config()
  if DRY_RUN.value:
    dry_run(config)
    return
  try:
    train.train(config, flags.WORKDIR.value)
  except workdir_lock.Busy as e:
    raise errors.UserError(f'Not training: {e}') from e
  except errors.UserError:  # e.g. the prepared data's build, which says what it removed
    raise
  except Exception as e:  # pylint: disable=broad-except
    if not files.out_of_space(e):
      raise
    raise errors.UserError(checkpoint.out_of_space_message(flags.WORKDIR.value, e)) from e


if __name__ == '__main__':
  cli.run(main)
