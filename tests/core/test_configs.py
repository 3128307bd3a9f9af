"""Every config variant builds its model, and configs refuse unknown keys."""
import importlib

import pytest
from flax import nnx

VARIANTS = [('configs.grapheme', v) for v in ('demo', 'kaggle', 'test')] + [
    ('configs.fragments', v) for v in ('demo', 'hisfrag20', 'test')]


@pytest.mark.parametrize('module,variant', VARIANTS)
def test_variant_builds_its_model(module, variant):
  config = importlib.import_module(module).get_config(variant)
  task = importlib.import_module(config.task)
  model = nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0)))  # shapes only
  assert nnx.state(model, nnx.Param)


@pytest.mark.parametrize('module', ['configs.grapheme', 'configs.fragments'])
def test_configs_are_locked(module):
  config = importlib.import_module(module).get_config('test')
  with pytest.raises(AttributeError):
    config.train.stepz = 3
  with pytest.raises(ValueError, match='expected one of'):
    importlib.import_module(module).get_config('nope')
