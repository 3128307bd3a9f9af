"""Trains a fragment recipe on the demo's writers and scores it on three sets; one record a run.

  python -m experiments.fragment_family --name NAME --workdir workdirs/family/NAME \\
      --config configs/fragments.py:demo [--config.train.lr=4e-3 ...]

The sets, each scored as split 'test' of a folder whose train/ is the demo's (SRS-LBP's PCA is
fitted there, as for the demo's own test):

  valfam  data/fragments-valfam (retrieval/synthetic/synth_val.py, seed 0): the validation family. It
          chooses the post-processing (in-sample, so its 'tuned' row flatters) and, across
          runs, the recipe.
  test    data/fragments-synth/test: the project's own test (30 writers); reports.
  third   data/fragments-third (synth_val --draw third, seed 1: other fonts than training's
          and the family's); reports.

Nothing is chosen on test or third: both apply the family's post-processing unchanged. The
record (experiments/records/NAME.json) holds every score under valfam/, test/ and third/, the
training's wall time, and the commands: the data's and this one, as typed. Training runs in
a child process (launch.train, no evaluation during it); patches and SRS-LBP features are
cached in data/fragment-cache, shared by every run with the same patch settings. --data
trains on another folder (the upper bound: synth_val --train's look).
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys
import time

from absl import flags

from bench import common
from experiments import records
from launch import cli, flags as shared_flags

NAME = flags.DEFINE_string('name', '', 'Keep the scores as experiments/records/NAME.json (none: '
                           'only print them).')
NOTE = flags.DEFINE_string('note', '', 'What else a reader of the record needs to know.')
TRAIN = flags.DEFINE_bool('train', True, 'Train first (--notrain: score the workdir\'s model '
                          'as it is, e.g. with other eval settings).')

TRAIN_DATA = 'data/fragments-synth'
CACHE = 'data/fragment-cache'
EVAL_DIRS = 'data/fragment-family'
# (set, its test/ folder, the command that writes it)
SETS = (
    ('valfam', 'data/fragments-valfam/test',
     'python -m retrieval.synthetic.synth_val --out data/fragments-valfam --writers 40 --seed 0 '
     '--workers 2'),
    ('test', f'{TRAIN_DATA}/test',
     f'python -m retrieval.synthetic.synth --out {TRAIN_DATA} --writers-train 60 --writers-test 30 '
     '--pages-per-writer 4 --seed 0 --workers 2'),
    ('third', 'data/fragments-third/test',
     'python -m retrieval.synthetic.synth_val --out data/fragments-third --writers 32 --seed 1 '
     '--draw third --workers 2'))


def _path(relative):
  return os.path.join(common.ROOT, relative)


def eval_folder(name, test_dir):
  """data/fragment-family/NAME: test/ -> the set's fragments, train/ -> the demo's."""
  folder = _path(os.path.join(EVAL_DIRS, name))
  os.makedirs(folder, exist_ok=True)
  for split, target in (('test', test_dir), ('train', f'{TRAIN_DATA}/train')):
    link = os.path.join(folder, split)
    if not os.path.islink(link):
      os.symlink(_path(target), link)
  return folder


def config_args():
  """This command's --config flags (and the value after a bare --config), for launch.train."""
  args = sys.argv[1:]
  return [a for i, a in enumerate(args)
          if a.startswith('--config') or i and args[i - 1] == '--config']


def train(workdir, data):
  """launch.train in a child process; its wall time in seconds."""
  command = [sys.executable, '-m', 'launch.train', *config_args(), '--data', data,
             '--workdir', workdir, f'--config.data.cache_dir={_path(CACHE)}',
             '--config.evals.val.every=0', '--config.evals.test.every=0']
  start = time.time()
  subprocess.run(command, cwd=common.ROOT, check=True)
  return time.time() - start


def score(config, workdir):
  """{set: the evaluator's scores} on the three sets, valfam first: it chooses."""
  from bengrapheme import restored
  from retrieval.fragments import evaluate
  _, model = restored.trained_model(config, workdir)
  # SRS-LBP's PCA fit on train/ is the same for every run: kept beside the patch cache.
  os.makedirs(os.path.join(workdir, 'eval'), exist_ok=True)
  for kept in glob.glob(os.path.join(_path(CACHE), 'srs_lbp_fit-*.npy')):
    shutil.copy(kept, os.path.join(workdir, 'eval'))
  results, chosen = {'step': model.step}, None
  for name, test_dir, _ in SETS:
    own = config.copy_and_resolve_references()
    own.data.dir = eval_folder(name, test_dir)
    own.eval.export_distances = False
    scores, _ = evaluate.Evaluator(own, 'test', workdir).run(
        model, chosen=chosen, tune=chosen is None)
    if chosen is None:
      chosen = dict(scores['tuned_settings'], chosen_on='valfam')
      scores['tuned_settings'] = chosen
    # The fragment task's target measure: writer mAP as a multiple of SRS-LBP's on the same set.
    scores['ratio'] = {m: scores[m]['writer']['map'] / scores['srs_lbp']['writer']['map']
                       for m in ('encoder', 'tuned')}
    results[name] = scores
    print(f'{name}: writer mAP encoder {scores["encoder"]["writer"]["map"]:.3f}, tuned '
          f'{scores["tuned"]["writer"]["map"]:.3f}, SRS-LBP '
          f'{scores["srs_lbp"]["writer"]["map"]:.3f}', flush=True)
  for made in glob.glob(os.path.join(workdir, 'eval', 'srs_lbp_fit-*.npy')):
    shutil.copy(made, _path(CACHE))
  return results


def main(argv):
  del argv
  commit = records.commit_of() if NAME.value else ''
  missing = [command for _, test_dir, command in SETS if not os.path.isdir(_path(test_dir))]
  if missing:
    raise SystemExit(f'missing data; write it first: {missing[0]}')
  config = shared_flags.config()
  data = shared_flags.DATA.value or TRAIN_DATA
  workdir = shared_flags.WORKDIR.value
  config.data.cache_dir = _path(CACHE)
  seconds = train(workdir, data) if TRAIN.value else 0.0
  results = score(config, workdir)
  results['train_seconds'] = seconds
  command = 'python -m experiments.fragment_family ' + ' '.join(map(shlex.quote, sys.argv[1:]))
  trained = (f'Training ({results["step"]} steps) took {seconds:.0f} s of wall time on 2 CPU '
             'cores shared with other work (heavy jobs take turns under a lock; others\' '
             'tests may not), so slower than on a quiet machine; a restart resumes, so after '
             'an interruption this is the last leg only.' if TRAIN.value else
             f'The model of {workdir} as it was (step {results["step"]}), not trained again.')
  note = (f'{trained} valfam chose the post-processing; test and third applied it unchanged. '
          f'{NOTE.value}').strip()
  if NAME.value:
    print(records.add(NAME.value, workdir, [c for _, _, c in SETS] + [command], commit, note,
                      scores=results))


if __name__ == '__main__':
  cli.run(main)
