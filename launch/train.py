"""Trains; rerunning the same command resumes from the newest checkpoint in --workdir.

  python -m launch.train --config configs/grapheme.py:demo --data DATA --workdir DIR
"""
from absl import app

from launch import flags


def main(argv):
  del argv
  from bengrapheme import train
  train.train(flags.config(), flags.WORKDIR.value)


if __name__ == '__main__':
  app.run(main)
