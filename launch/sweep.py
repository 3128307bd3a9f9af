"""Runs a sweep a config declares (its get_sweeps; bengrapheme/sweep.py): each trial an
ordinary run in WORKDIR/trials/NNN, the settings chosen on validation by Optuna.

  python -m launch.sweep --config configs/grapheme.py:demo --sweep lr_tau --data DATA \\
      --workdir workdirs/sweeps/grapheme
  python -m launch.sweep ... --report_test   # once the sweep is done: the chosen trial on test

Rerunning the same command resumes: finished trials are kept, one a killed process left is
resumed from its checkpoint. Several processes (one machine: the journal file in WORKDIR;
many: --storage with an RDB URL, WORKDIR on a shared disk) work on one study, each trial
once. It leaves WORKDIR/sweep/trials.csv, report.html, record.json and chosen.flags, which
trains the chosen settings again:

  python -m launch.train --config configs/grapheme.py:demo --flagfile WORKDIR/sweep/chosen.flags \\
      --data DATA --workdir DIR

A trial is a run like any other: `launch.evaluate --workdir WORKDIR/trials/NNN` scores it
with the config it recorded.
"""
import sys

from absl import flags
from ml_collections import config_flags

from launch import cli, flags as shared_flags

SWEEP = flags.DEFINE_string('sweep', None, 'The sweep to run: a name the config file\'s '
                            'get_sweeps(arg) declares.')
TRIALS = flags.DEFINE_integer('trials', 0, 'How many trials in all (0: the sweep\'s own '
                              'budget).', lower_bound=0)
STORAGE = flags.DEFINE_string('storage', '', 'The study\'s storage as an RDB URL '
                              '(sqlite:///FILE, postgresql://...), for processes on many '
                              'machines; default: the journal file WORKDIR/sweep/journal.log.')
REPORT_TEST = flags.DEFINE_bool('report_test', False, 'After the sweep, score the chosen '
                                'trial on the run\'s own test split, once (WORKDIR/sweep/'
                                'test.json).')
flags.mark_flag_as_required('sweep')


def main(argv):
  del argv
  from bengrapheme import sweep
  base = shared_flags.config()  # first: it says in one line when --config is missing
  config_arg = config_flags.get_config_filename(flags.FLAGS['config'])
  declared = sweep.declared(config_arg, SWEEP.value)
  workdir = shared_flags.WORKDIR.value
  given = config_flags.get_override_values(flags.FLAGS['config'])
  # The sweep's command, as its record names it: --report_test only reports on it.
  command = 'python -m launch.sweep ' + ' '.join(
      a for a in sys.argv[1:] if not a.startswith(('--report_test', '--noreport_test')))
  found = sweep.run(base, declared, workdir, config_arg, given, TRIALS.value, STORAGE.value,
                    command)
  if REPORT_TEST.value:
    sweep.report_test(found, declared, base, workdir)


if __name__ == '__main__':
  cli.run(main)
