"""What launch.train's checks report on this host, kept as a record that docs/scaling.md's
tables are drawn from: `--dry_run` of the full recipes (parameters, FLOPs per image, memory
per device, compile time, whether the step ran: only where its memory fits) and
`--feed_check` of the grapheme demo on a small synthetic set (the input's and the step's
examples/s, the cores the input kept busy).

  python -m experiments.preflight_checks --record preflight-checks
"""
import tempfile
import argparse
import os
import re
import subprocess
import sys

from bench import common
from experiments import records

# name: launch.train's arguments after --dry_run.
CASES = {
    'kaggle': ('--config=configs/grapheme.py:kaggle',),
    'kaggle_8_devices': ('--config=configs/grapheme.py:kaggle', '--dry_run_devices=8'),
    'hisfrag20_batch8': ('--config=configs/fragments.py:hisfrag20', '--config.train.batch_size=8',
                         '--config.train.writers_per_batch=2'),
}
FIGURES = {
    'params': r'^Parameters: ([\d,]+)$',
    'gflop_per_image': r'^FLOPs per image: ([\d,.]+) GFLOP',
    'memory_per_device_mib': r'^Memory per device: ([\d,.]+) MiB',
    'temporaries_mib': r'temporaries ([\d,.]+) MiB',
    'compile_s': r'^Compiled the train step in ([\d.]+) s\.$',
}


FEED_FIGURES = {
    'input_per_s': r'Input \(process 0\): ([\d,.]+) examples/s',
    'input_cores': r'; ([\d.]+) of \d+ host cores busy',
    'step_per_s': r'^Train step: ([\d,.]+) examples/s',
}


def train_check(args, patterns):
  """launch.train with `args`; the numbers its output gives for `patterns`."""
  command = [sys.executable, '-m', 'launch.train', *args]
  env = dict(os.environ, PYTHONPATH=common.ROOT, JAX_PLATFORMS='cpu')
  result = subprocess.run(command, cwd=common.ROOT, env=env, capture_output=True, text=True)
  if result.returncode:
    raise SystemExit(f'{" ".join(command)} exited {result.returncode}:\n{result.stderr[-3000:]}')
  print(result.stdout, flush=True)
  figures = {}
  for name, pattern in patterns.items():
    match = re.search(pattern, result.stdout, re.M)
    if not match:
      raise SystemExit(f'no line matching {pattern!r} in:\n{result.stdout}')
    figures[name] = float(match.group(1).replace(',', ''))
  return figures, result.stdout


def dry_run(args):
  """The dry run's figures, and 1 where it ran the step (0 where it said why not)."""
  figures, out = train_check(('--dry_run', *args), FIGURES)
  figures['ran'] = int('One step on random data' in out)
  return figures


def feed_check(seconds):
  """The grapheme demo's feed check on 2,000 synthetic images; 1 where the input bounds."""
  from bengrapheme.grapheme import synth
  with tempfile.TemporaryDirectory() as data:
    synth.write_dataset(data, num_train=2000, num_test=10, seed=0, workers=2)
    figures, out = train_check(('--config=configs/grapheme.py:demo', '--data', data,
                                '--feed_check', f'--feed_check_seconds={seconds}'),
                               FEED_FIGURES)
  figures['input_bound'] = int('Bound by the input' in out)
  return figures


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--record', default='', help='keep the figures as experiments/records/NAME.json')
  parser.add_argument('--seconds', type=float, default=20.0, help='the feed check\'s time a part')
  args = parser.parse_args()
  commit = records.commit_of() if args.record else ''
  scores = {f'{case}/{k}': v for case, case_args in CASES.items()
            for k, v in dry_run(case_args).items()}
  scores.update({f'demo_feed/{k}': v for k, v in feed_check(args.seconds).items()})
  if args.record:
    command = f'python -m experiments.preflight_checks --record {args.record}'
    print(records.add(args.record, None, [command], commit,
                      '2 CPU cores shared with other work: compile times vary with the load',
                      scores=scores))


if __name__ == '__main__':
  main()
