"""Each task's `test` recipe trains bit for bit as the recorded commit's code trains it: the
same losses and the same parameters after a few steps on its random_batch. A change to the
trainer, the optimizer, a loss or a model that is meant to keep the recipes as they are must
keep this test passing; a change that means to alter a recipe rewrites the record
(`python tests/core/test_recipes_unchanged.py`) in the same commit, saying why.

XLA compiles for the CPU it runs on, so the same code may round differently on another
machine: recipes_unchanged.json keeps the recorded commit's results with the CPU they were
computed on, and on any other CPU the test trains that commit's code here (a git worktree of
it) and compares with that, bit for bit all the same."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORD = pathlib.Path(__file__).with_name('recipes_unchanged.json')
STEPS = 3
CONFIGS = ('configs.grapheme', 'configs.fragments', 'configs.maskfeat', 'configs.writer_id')


def recipe_config(module):
  import importlib
  config = importlib.import_module(module).get_config('test')
  if module == 'configs.writer_id':
    config.model.num_writers = 4  # else counted from a data folder, which this test has not
  return config


def digest(tree):
  """sha256 of every leaf's bytes, dtype and shape, in the tree's order."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(jax.device_get(tree)):
    leaf = np.asarray(leaf)
    h.update(f'{leaf.dtype}{leaf.shape}'.encode())
    h.update(np.ascontiguousarray(leaf).tobytes())
  return h.hexdigest()


def trained(module):
  """{'losses': [float.hex() of each step's loss], 'params': digest of the parameters and
  model state after STEPS steps}, each step on random_batch drawn with seed = the step."""
  from bengrapheme import parallel, train
  config = recipe_config(module)
  task = train.load_task(config)
  mesh = parallel.make_mesh(config.mesh)
  _, state, step = train.state_and_step(config, task, mesh, pretrained=False)
  losses = []
  for i in range(STEPS):
    batch_config = config.copy_and_resolve_references()
    batch_config.seed = i
    batch = task.random_batch(batch_config, config.train.batch_size)
    state, scalars = step(state, parallel.global_batch(mesh, batch))
    losses.append(float(jax.device_get(scalars['loss'])).hex())
  return {'losses': losses, 'params': digest((state['params'], state['model_state']))}


def machine():
  """What XLA:CPU compiles for: the CPU's model and its instruction-set flags."""
  info = pathlib.Path('/proc/cpuinfo').read_text() if os.path.exists('/proc/cpuinfo') else ''
  pairs = (line.split(':', 1) for line in info.splitlines() if ':' in line)
  fields = {key.strip(): value for key, value in pairs}
  flags = ' '.join(sorted(fields.get('flags', '').split()))
  return {'cpu': fields.get('model name', '').strip(),
          'flags': hashlib.sha256(flags.encode()).hexdigest()[:16]}


def trained_at(commit):
  """The recipes' results from `commit`'s code, trained on this machine in a git worktree."""
  with tempfile.TemporaryDirectory() as tmp:
    tree = os.path.join(tmp, 'tree')
    git = subprocess.run(['git', 'worktree', 'add', '--detach', tree, commit], cwd=ROOT,
                         capture_output=True, text=True)
    if git.returncode:
      pytest.fail(f'git worktree add {commit}: {git.stderr.strip()} (a shallow clone lacks '
                  'it: `git fetch --unshallow` first)')
    try:
      env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS='cpu')
      script = os.path.join('tests', 'core', pathlib.Path(__file__).name)
      run = subprocess.run([sys.executable, script], cwd=tree, env=env, capture_output=True,
                           text=True)
      assert run.returncode == 0, f'training at {commit} failed:\n{run.stderr[-3000:]}'
      written = json.loads(pathlib.Path(tree, 'tests', 'core', RECORD.name).read_text())
    finally:
      subprocess.run(['git', 'worktree', 'remove', '--force', tree], cwd=ROOT,
                     capture_output=True)
  return written.get('recipes', written)


@pytest.fixture(scope='module')
def before():
  record = json.loads(RECORD.read_text())
  if record['machine'] == machine():
    return record['recipes']
  return trained_at(record['commit'])


@pytest.mark.slow  # about 75 CPU-seconds: four compiles (twice that on another CPU)
@pytest.mark.parametrize('module', CONFIGS)
def test_recipe_trains_as_recorded(module, before):
  assert trained(module) == before[module], (
      f'{module}:test no longer trains as the recorded commit\'s code does')


if __name__ == '__main__':
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  sys.path.insert(0, str(ROOT))
  commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  RECORD.write_text(json.dumps({'commit': commit, 'machine': machine(),
                                'recipes': {m: trained(m) for m in CONFIGS}}, indent=1) + '\n')
  print(f'wrote {RECORD}')
