"""Trains; rerunning the same command resumes from the newest checkpoint in --workdir.

  python -m launch.train --config configs/grapheme.py:demo --data DATA --workdir DIR

One run at a time owns a workdir: a second one exits at once (status 1) naming the holder.
A full disk stops training with a message naming the workdir and the space left; the
checkpoints already saved stay restorable, and rerunning after freeing space resumes.
"""
from absl import app

from launch import flags


def main(argv):
  del argv
  from bengrapheme import checkpoint, files, train, workdir_lock
  config = flags.config()
  try:
    train.train(config, flags.WORKDIR.value)
  except workdir_lock.Busy as e:
    raise SystemExit(f'Not training: {e}') from None
  except files.OutOfSpace as e:  # the prepared data's build says what was removed
    raise SystemExit(str(e)) from None
  except Exception as e:  # pylint: disable=broad-except
    if not files.out_of_space(e):
      raise
    raise SystemExit(checkpoint.out_of_space_message(flags.WORKDIR.value, e)) from None


if __name__ == '__main__':
  app.run(main)
