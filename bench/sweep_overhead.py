"""The sweep's own time per trial, apart from the trial's training and evaluation.

  python -m bench.sweep_overhead [--trials 4] [--out bench/sweep_overhead.json]

Runs configs/grapheme.py:test's smoke sweep, with its grid widened to --trials learning rates,
in this process on a tiny synthetic dataset. The sweep's own work is everything except the
time spent inside each trial's training and its final evaluation: making and loading the
study, claiming trials under the lock, building each trial's config, and writing trials.csv,
report.html (with its matplotlib charts), chosen.flags and record.json after every trial.
The reference is the trials' own mean time, measured in the same run. Process start-up and
imports are left out, since a plain launch.train pays them too. The result is printed and
written as JSON (command, commit, date, machine, figures).
"""
import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--trials', type=int, default=4)
  parser.add_argument('--out', default='bench/sweep_overhead.json')
  args = parser.parse_args()
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  from bengrapheme import sweep
  from bengrapheme.grapheme import synth
  from configs import grapheme

  with tempfile.TemporaryDirectory() as folder:
    data = os.path.join(folder, 'data')
    synth.write_dataset(data, num_train=96, num_test=24, seed=0, workers=1)
    declared = dict(sweep.declared('configs/grapheme.py:test', 'smoke'), trials=args.trials,
                    space={'train.lr': [1e-3 * 2 ** i for i in range(args.trials)]})
    config = grapheme.get_config('test')
    config.data.dir = data
    workdir = os.path.join(folder, 'sweep')
    began = time.perf_counter()
    found = sweep.run(config, declared, workdir, 'configs/grapheme.py:test')
    wall = time.perf_counter() - began
    trials = [t.user_attrs['seconds'] for t in found.get_trials()]
  overhead = (wall - sum(trials)) / len(trials)
  mean = sum(trials) / len(trials)
  result = dict(
      command='python -m bench.sweep_overhead ' + ' '.join(sys.argv[1:]),
      commit=sweep._commit(),  # pylint: disable=protected-access
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      machine=dict(platform=platform.platform(), cpus=os.cpu_count()),
      trials=len(trials), sweep_seconds=round(wall, 2),
      trial_seconds=[round(t, 2) for t in trials],
      overhead_per_trial_s=round(overhead, 3), trial_mean_s=round(mean, 2),
      overhead_share=round(overhead / mean, 4))
  print(f'sweep overhead per trial: {overhead:.2f} s, against a trial\'s own {mean:.1f} s '
        f'({overhead / mean:.1%}); {len(trials)} trials of configs/grapheme.py:test')
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')


if __name__ == '__main__':
  main()
