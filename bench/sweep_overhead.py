"""The sweep's own time per trial, apart from the trial's training and evaluation.

  python -m bench.run --only sweep_overhead

Runs configs/grapheme.py:test's smoke sweep, with its grid widened to 5 learning rates (each
trial a turn), in this process on a tiny synthetic dataset. The sweep's own work is
everything except the time spent inside each trial's training and its final evaluation:
claiming the trial under the lock, building its config, and writing trials.csv, report.html
(with its matplotlib charts), chosen.flags and record.json after it. A trial's share is the
time from its start to the next one's (to the sweep's end, for the last) less its own
training and evaluation; the study's making and loading goes to the first. The reference is
the trials' own time, measured in the same run. Process start-up and imports are left out,
since a plain launch.train pays them too.
"""
import os
import tempfile
import time

from bench import common

TRIALS = common.MIN_REPEATS


def run(quick):
  del quick  # the test config's trials are already the smallest a sweep runs
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  from bengrapheme import sweep
  from bengrapheme.grapheme import synth
  from configs import grapheme

  with tempfile.TemporaryDirectory() as folder:
    data = os.path.join(folder, 'data')
    synth.write_dataset(data, num_train=96, num_test=24, seed=0, workers=1)
    declared = dict(sweep.declared('configs/grapheme.py:test', 'smoke'), trials=TRIALS,
                    space={'train.lr': [1e-3 * 2 ** i for i in range(TRIALS)]})
    config = grapheme.get_config('test')
    config.data.dir = data
    before = common.quiet_load_average()
    began = time.time()
    found = sweep.run(config, declared, os.path.join(folder, 'sweep'),
                      'configs/grapheme.py:test')
    ended = time.time()
    trials = sorted(found.get_trials(), key=lambda t: t.number)
  starts = [began] + [t.datetime_start.timestamp() for t in trials[1:]] + [ended]
  each = [dict(own=(starts[i + 1] - starts[i]) - t.user_attrs['seconds'],
               trial=t.user_attrs['seconds']) for i, t in enumerate(trials)]
  turns = common.Turns({}, each, (before, common.load_average()))
  return [common.timed_record(
      "sweep: its own time per trial (claim, config, the table, report and record after it)",
      's', "the trial's own training and evaluation (configs/grapheme.py:test, 5 trials)",
      turns, lambda t: (t['own'], t['trial'], t['trial'] / t['own']),
      target='>= 20x (at most 5% of a trial)', meets=lambda value, ratio: ratio >= 20,
      note='the smallest trials a sweep runs: a longer trial makes the share smaller')]
