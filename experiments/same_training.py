"""Training unchanged by a refactor: each recipe's `test` variant trained for a few steps by
an earlier commit's code (a git worktree of it) and by this tree, on the same data, and the
final train states (parameters, optimizer and EMA state, counters) compared bitwise.

Run it with the commit before any change meant to leave training as it is (the record's:
losses, evaluators, parameter groups and layer decay chosen by name in the config). Each
recipe names its variant in both trees, since variant names may differ between them
(`saghog_test` at 9efd4a7 is `recipe=saghog,size=test`).

  python -m experiments.same_training --before 9efd4a7 --record same-training-task-protocol
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench import common
from experiments import records

STEPS = 6
# recipe: (data, variant before, variant now, overrides in both). Gradient accumulation and
# EMA on, so that the micro-batching and the averaged state are compared too.
RECIPES = {
    'grapheme': ('grapheme', 'configs/grapheme.py:test', 'configs/grapheme.py:test', ()),
    'fragments': ('fragments', 'configs/fragments.py:test', 'configs/fragments.py:test', ()),
    'saghog': ('fragments', 'configs/fragments.py:saghog_test',
               'configs/fragments.py:recipe=saghog,size=test', ()),
}
COMMON = ('--config.train.ema_decay=0.9',)


def write_data(root):
  from bengrapheme.grapheme import synth as grapheme_synth
  from retrieval.synthetic import synth as fragment_synth
  paths = {'grapheme': os.path.join(root, 'bengali'), 'fragments': os.path.join(root, 'hisfrag')}
  grapheme_synth.write_dataset(paths['grapheme'], num_train=96, num_test=24, seed=0, workers=1)
  fragment_synth.write_dataset(paths['fragments'], writers_train=6, writers_test=4,
                               pages_per_writer=2, seed=0, workers=1, page_size=(500, 700))
  return paths


def train(tree, config, data, workdir, overrides):
  # A worktree holds no fonts/node_modules: the rendered graphemes read this tree's.
  fonts = os.path.join(common.ROOT, 'fonts', 'node_modules', '@expo-google-fonts')
  env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=1',
             BENGRAPHEME_GOOGLE_FONTS=fonts)
  command = [sys.executable, '-m', 'launch.train', f'--config={config}', '--data', data,
             '--workdir', workdir, f'--config.train.steps={STEPS}', *COMMON, *overrides]
  result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
  if result.returncode:
    raise SystemExit(f'{" ".join(command)} (in {tree}) exited {result.returncode}:\n'
                     f'{result.stdout[-2000:]}\n{result.stderr[-4000:]}')


def final_state(workdir):
  import orbax.checkpoint as ocp
  path = os.path.join(workdir, 'checkpoints', str(STEPS), 'state')
  return ocp.StandardCheckpointer().restore(path)


def compare(a, b):
  """(number of arrays, number that differ in any byte, the largest absolute difference)."""
  import jax
  leaves_a, tree_a = jax.tree_util.tree_flatten_with_path(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten_with_path(b)
  if tree_a != tree_b:
    raise SystemExit(f'the train states differ in structure:\n{tree_a}\n{tree_b}')
  differ, largest = 0, 0.0
  for (_, x), (_, y) in zip(leaves_a, leaves_b):
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
      differ += 1
      if x.shape == y.shape and np.issubdtype(x.dtype, np.number):
        largest = max(largest, float(np.max(np.abs(x.astype(np.float64) - y))))
  return len(leaves_a), differ, largest


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--before', required=True, help='the commit whose training to match')
  parser.add_argument('--record', default='', help='keep the result as experiments/records/NAME.json')
  args = parser.parse_args()
  commit = records.commit_of() if args.record else ''
  scores = {}
  with tempfile.TemporaryDirectory() as scratch:
    before_tree = os.path.join(scratch, 'before')
    subprocess.run(['git', 'worktree', 'add', '--detach', before_tree, args.before],
                   cwd=common.ROOT, check=True, capture_output=True)
    try:
      data = write_data(os.path.join(scratch, 'data'))
      for recipe, (kind, config_before, config_now, overrides) in RECIPES.items():
        states = []
        for tree, config in ((before_tree, config_before), (common.ROOT, config_now)):
          workdir = os.path.join(scratch, 'work', recipe, os.path.basename(tree))
          train(tree, config, data[kind], workdir, overrides)
          states.append(final_state(workdir))
        arrays, differ, largest = compare(*states)
        print(f'{recipe}: {arrays} arrays, {differ} differ, largest difference {largest:g}')
        scores.update({f'{recipe}/arrays': arrays, f'{recipe}/arrays_that_differ': differ,
                       f'{recipe}/largest_difference': largest})
    finally:
      subprocess.run(['git', 'worktree', 'remove', '--force', before_tree], cwd=common.ROOT,
                     check=True)
  if args.record:
    command = f'python -m experiments.same_training --before {args.before} --record {args.record}'
    print(records.add(args.record, None, [command], commit,
                      f'{STEPS} steps of each recipe, EMA on, 1 CPU device; the states '
                      f'trained at {args.before} and at this commit compared byte for byte',
                      scores=scores))
  if any(v for k, v in scores.items() if k.endswith('/arrays_that_differ')):
    raise SystemExit('training differs from the commit before')


if __name__ == '__main__':
  main()
