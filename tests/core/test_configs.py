"""Every config variant builds its model, and configs refuse unknown keys."""
import importlib
import os
import subprocess
import sys

import pytest
from flax import nnx

from conftest import ROOT

CONFIGS = ('configs.grapheme', 'configs.fragments', 'configs.maskfeat', 'configs.writer_id')
VARIANTS = [(module, v) for module in CONFIGS for v in importlib.import_module(module).VARIANTS]


@pytest.mark.parametrize('module,variant', VARIANTS)
def test_variant_builds_its_model(module, variant):
  config = importlib.import_module(module).get_config(variant)
  if 'num_writers' in config.model:  # else counted from the data, which this test has not
    config.model.num_writers = 3
  task = importlib.import_module(config.task)
  model = nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0)))  # shapes only
  assert nnx.state(model, nnx.Param)


@pytest.mark.parametrize('module', CONFIGS)
def test_configs_are_locked(module):
  config = importlib.import_module(module).get_config('test')
  with pytest.raises(AttributeError):
    config.train.stepz = 3
  with pytest.raises(ValueError, match='expected one of'):
    importlib.import_module(module).get_config('nope')


def test_config_arguments_are_named_and_checked():
  from configs import fragments
  assert (fragments.get_config('test').to_json() ==
          fragments.get_config('size=test,recipe=resnet').to_json())
  assert fragments.get_config('recipe=saghog,size=test').model.name == 'vit'
  with pytest.raises(ValueError, match=r"^configs/fragments.py:recipe=sag: recipe='sag': "
                     'expected one of resnet, saghog$'):
    fragments.get_config('recipe=sag')
  with pytest.raises(ValueError, match=r"^configs/fragments.py:model=vit: no argument "
                     "'model'; expected size, recipe, data$"):
    fragments.get_config('model=vit')


def test_reading_a_config_imports_no_framework():
  """Configs are read by tools and notebooks that may never train: a fresh process reads
  every variant without importing jax, Orbax, flax or matplotlib."""
  code = ('import sys, configs.grapheme, configs.fragments, configs.maskfeat, configs.writer_id\n'
          f'for module, variant in {VARIANTS!r}:\n'
          '  sys.modules[module].get_config(variant)\n'
          "print(sorted(m for m in ('jax', 'orbax', 'flax', 'matplotlib') if m in sys.modules))")
  result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), check=True)
  assert result.stdout.strip() == '[]'


def test_a_task_missing_a_function_fails_at_load_naming_it(tmp_path, monkeypatch):
  from bengrapheme import protocols, train
  from configs import grapheme
  (tmp_path / 'half_task.py').write_text(
      'from bengrapheme.grapheme.task import (EVALUATORS, check_data, make_model, '
      'random_batch, train_data)\n')  # no loss
  monkeypatch.syspath_prepend(str(tmp_path))
  config = grapheme.get_config('test')
  with config.unlocked():
    config.task = 'half_task'
  with pytest.raises(protocols.SeamError) as error:
    train.load_task(config)
  assert str(error.value) == (
      "task module 'half_task' lacks loss; bengrapheme/protocols.py's Task provides "
      'check_data, train_data, make_model, loss, random_batch')
  config.task = 'bengrapheme.grapheme.task'
  assert train.load_task(config)  # the real one passes


def test_an_evaluator_missing_a_method_is_named():
  from bengrapheme import protocols
  class Partial:
    def run(self, model):
      del model
  with pytest.raises(protocols.SeamError, match=r'^evaluator lacks headline, summary, '
                     r"report_sections; bengrapheme/protocols.py's Evaluator provides run, "):
    protocols.check(Partial(), protocols.Evaluator, 'evaluator')


def test_a_model_without_a_backbone_is_named_before_any_work(monkeypatch):
  """protocols.Model: fine-tuning (model.init_from) and the k-NN probe read model.backbone;
  load_task checks the model's shapes."""
  import importlib
  from bengrapheme import protocols, train
  from bengrapheme.grapheme import model as grapheme_model
  from configs import grapheme
  config = grapheme.get_config('test')
  task = importlib.import_module(config.task)
  made = grapheme_model.make_model

  def without_backbone(config, rngs):
    model = made(config, rngs)
    del model.backbone
    return model
  monkeypatch.setattr(task, 'make_model', without_backbone)
  with pytest.raises(protocols.SeamError, match=r"^the model of task 'bengrapheme.grapheme."
                     r"task' lacks backbone; bengrapheme/protocols.py's Model provides "
                     r'__call__, backbone'):
    train.load_task(config)


def test_a_sampler_without_len_is_named():
  from bengrapheme import input as input_lib, protocols
  with pytest.raises(protocols.SeamError, match='^the training sampler lacks __len__'):
    input_lib.train_stream(type('Sampler', (), {'__getitem__': lambda self, b: [b]})(),
                           lambda indices: {}, local_batch=1, process_index=0)
