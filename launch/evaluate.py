"""Scores the newest checkpoint on config.eval.splits; writes WORKDIR/eval/metrics.json.

  python -m launch.evaluate --config configs/grapheme.py:demo --data DATA --workdir DIR
"""
import json

from absl import app

from launch import flags


def main(argv):
  del argv
  from bengrapheme import train
  report = train.evaluate(flags.config(), flags.WORKDIR.value)
  print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == '__main__':
  app.run(main)
