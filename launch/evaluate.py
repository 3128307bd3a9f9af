"""Scores the newest checkpoint with every evaluator of config.evals (or those --evals names);
writes WORKDIR/eval/metrics.json (every score) and WORKDIR/eval/report.html, and prints a
table of the headline scores.

  python -m launch.evaluate --config configs/grapheme.py:demo --data DATA --workdir DIR
  python -m launch.evaluate --data DATA --workdir DIR  # the config DIR/config.json records
  python -m launch.evaluate ... --evals test        # one evaluator (its name in config.evals)
"""
from absl import flags

from launch import cli, flags as shared_flags

EVALS = flags.DEFINE_list('evals', None, 'The entries of config.evals to run (default: all).')


def main(argv):
  del argv
  from bengrapheme import restored, errors
  config = shared_flags.config(from_workdir=True)
  unknown = [n for n in EVALS.value or () if n not in config.evals]
  if unknown:
    raise errors.ConfigError(f'--evals {unknown[0]}: expected one of config.evals '
                             f'({", ".join(config.evals)})')
  restored.evaluate(config, shared_flags.WORKDIR.value, EVALS.value)


if __name__ == '__main__':
  cli.run(main)
