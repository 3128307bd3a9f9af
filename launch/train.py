"""Trains; rerunning the same command resumes from the newest checkpoint in --workdir.

  python -m launch.train --config configs/grapheme.py:demo --data DATA --workdir DIR

One run at a time owns a workdir: a second one exits at once (status 1) naming the holder.
A full disk stops training with a message naming the workdir and the space left; the
checkpoints already saved stay restorable, and rerunning after freeing space resumes.

Before a long run, two checks, each writing nothing (--workdir may be left out):

--dry_run compiles the config's train step ahead of time from shapes alone, for the devices
here or, with --dry_run_devices=N, for N simulated ones (a pod this host does not have); it
prints the parameter count, FLOPs per image and per device, memory per device and compile
time, and runs one step on random data where that memory fits (else says in one line why
not). It reads no data and no weight file:

  python -m launch.train --config configs/grapheme.py:kaggle --dry_run
  python -m launch.train --config configs/grapheme.py:kaggle --dry_run --dry_run_devices=8

--feed_check runs the config's real input pipeline alone, then the compiled train step alone
on a random batch kept on the devices, for --feed_check_seconds each, and says which one
bounds the run, by how much, and what the input would need (per process on a multi-process
job). It prepares the data in a temporary folder unless --config.data.cache_dir names one
(e.g. a run's WORKDIR/prepared, reused):

  python -m launch.train --config configs/grapheme.py:demo --data DATA --feed_check
"""
import os
import sys

from absl import flags as absl_flags

from launch import cli, flags

DRY_RUN = absl_flags.DEFINE_bool(
    'dry_run', False, 'Compile the train step ahead of time and run one step on random data '
    'where it fits; print the parameter count, FLOPs, memory per device and compile time. '
    'Needs no --data, --workdir or weight file; writes nothing.')
DRY_RUN_DEVICES = absl_flags.DEFINE_integer(
    'dry_run_devices', None, 'With --dry_run: compile for this many simulated devices (a '
    'topology this host does not have) instead of the devices here; the step is not run.',
    lower_bound=1)
FEED_CHECK = absl_flags.DEFINE_bool(
    'feed_check', False, 'Measure the input pipeline alone and the train step alone; say '
    'which bounds the run. Needs --data; writes nothing.')
FEED_CHECK_SECONDS = absl_flags.DEFINE_float(
    'feed_check_seconds', 20.0, 'With --feed_check: how long each part is measured.',
    lower_bound=0.1)


def simulate_devices(count):
  """N simulated CPU devices for the dry run: XLA reads the count when jax starts, which the
  configs and flags have not done yet."""
  from bengrapheme import errors
  if 'jax' in sys.modules:
    raise errors.UserError('--dry_run_devices: jax was started before the flag was read')
  os.environ['JAX_PLATFORMS'] = 'cpu'
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             f' --xla_force_host_platform_device_count={count}')


def main(argv):
  del argv
  from bengrapheme import errors
  if DRY_RUN_DEVICES.value and not DRY_RUN.value:
    raise errors.UserError('--dry_run_devices: only with --dry_run')
  if DRY_RUN.value and FEED_CHECK.value:
    raise errors.UserError('--dry_run and --feed_check: one at a time')
  if DRY_RUN_DEVICES.value:
    simulate_devices(DRY_RUN_DEVICES.value)
  from bengrapheme import checkpoint, files, train, workdir_lock
  from launch import preflight
  config = flags.config()
  if DRY_RUN.value:
    preflight.dry_run(config, simulated=bool(DRY_RUN_DEVICES.value))
    return
  if FEED_CHECK.value:
    preflight.feed_check(config, FEED_CHECK_SECONDS.value)
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
