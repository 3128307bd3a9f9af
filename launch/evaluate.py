"""Scores the newest checkpoint on config.eval.splits; writes WORKDIR/eval/metrics.json (every
score) and WORKDIR/eval/report.html, and prints a table of the headline scores.

  python -m launch.evaluate --config configs/grapheme.py:demo --data DATA --workdir DIR
"""

from launch import cli, flags


def main(argv):
  del argv
  from bengrapheme import eval_only
  eval_only.evaluate(flags.config(), flags.WORKDIR.value)


if __name__ == '__main__':
  cli.run(main)
