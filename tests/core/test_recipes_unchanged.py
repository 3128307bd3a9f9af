"""Each task's `test` recipe trains bit for bit as recorded in recipes_unchanged.json: the
same losses and the same parameters after a few steps on its random_batch. A change to the
trainer, the optimizer, a loss or a model that is meant to keep the recipes as they are must
keep this test passing; a change that means to alter a recipe rewrites the record
(`python tests/core/test_recipes_unchanged.py`) in the same commit, saying why."""
import hashlib
import json
import os
import pathlib
import sys

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


@pytest.mark.slow  # about 75 CPU-seconds: four compiles
@pytest.mark.parametrize('module', CONFIGS)
def test_recipe_trains_as_recorded(module):
  recorded = json.loads(RECORD.read_text())[module]
  assert trained(module) == recorded, (
      f'{module}:test no longer trains as recorded in {RECORD.name}')


if __name__ == '__main__':
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  sys.path.insert(0, str(ROOT))
  RECORD.write_text(json.dumps({m: trained(m) for m in CONFIGS}, indent=1) + '\n')
  print(f'wrote {RECORD}')
