"""A bad config value stops every entry point in one line naming the field's path and what it
allows, before any data work: each task's validate (protocols.Validates), run by
train.load_task."""
import importlib
import re

import pytest

from bengrapheme import errors, train
from conftest import run_module

def group(**fields):
  """A parameter group of train.groups, with `fields` changed."""
  return {'pattern': 'backbone/.*', 'lr_scale': 0.5, 'frozen_steps': 0, **fields}


# (config, {field: bad value}, what the message says is allowed): one row per checked field.
BAD = [
    ('configs.grapheme', {'model.name': 'resnt'}, 'expected one of'),
    ('configs.grapheme', {'data.format': 'folder'}, "'kaggle', 'tfds'"),
    ('configs.grapheme', {'data.format': 'tfds'}, 'needs data.tfds_dir'),
    ('configs.grapheme', {'unseen.never_rendered': 1.0}, 'a share in [0, 1)'),
    ('configs.grapheme', {'unseen.val_graphemes': -0.1}, 'a share in [0, 1)'),
    ('configs.grapheme', {'render.fraction': 1.0}, 'a share in [0, 1)'),
    ('configs.grapheme', {'render.images': 0}, 'expected >= 1'),
    ('configs.grapheme', {'predict.read': 'memory'}, "'stream', 'prepared'"),
    ('configs.grapheme', {'predict.window_rows': -1}, 'expected >= 0'),
    ('configs.grapheme', {'loss.components.root': 2.0}, 'expected one of grapheme_root, '
     'vowel_diacritic, consonant_diacritic'),
    ('configs.grapheme', {'loss.components.vowel_diacritic': -1.0}, 'a weight >= 0'),
    ('configs.grapheme', {'loss.terms.root_leters': 0.1}, 'expected one of root_letters, '
     'grapheme'),
    ('configs.grapheme', {'loss.terms.grapheme': -0.5}, 'a weight >= 0'),
    ('configs.fragments', {'model.name': 'vitt'}, 'expected one of'),
    ('configs.fragments', {'data.format': 'kaggle'}, "'folder', 'collection', 'tfds'"),
    ('configs.fragments', {'data.format': 'tfds'}, 'needs data.tfds_dir'),
    ('configs.fragments', {'loss.name': 'triplet'}, 'batch_hard, multi_similarity'),
    ('configs.fragments', {'loss.multi_similarity.gamma': 1.0}, 'alpha, beta, lam, epsilon'),
    ('configs.fragments', {'model.pooling': 'max'}, "'gem', 'netvlad', 'netrvlad'"),
    ('configs.fragments', {'train.labels': 'writers'}, "'writer', 'surrogate'"),
    ('configs.fragments', {'data.format': 'collection', 'train.labels': 'writer'},
     "expected 'surrogate'"),
    ('configs.fragments', {'train.batch_size': 18}, 'train.writers_per_batch=4'),
    ('configs.fragments', {'eval.aggregation': 'mean'}, "'sum', 'vlad'"),
    ('configs.fragments', {'eval.whitening': 'none'}, "'self', 'train'"),
    ('configs.fragments', {'eval.tune_split': 'test'}, 'never chosen on test'),
    ('configs.fragments', {'eval.export_method': 'best'},
     "'encoder', 'srs_lbp', 'configured', 'tuned'"),
    ('configs.fragments', {'eval.tune_split': 'va'}, "config.evals ('test', 'val')"),
    ('configs.fragments', {'evals.val.type': 'fragment'}, "'fragments', 'knn_probe'"),
    ('configs.fragments', {'evals.val.type': 'retrieval.fragments.probe:Knn'}, 'retrieval.fragments.probe has no'),
    ('configs.fragments', {'evals.val.every': -1}, 'a number of steps >= 0'),
    ('configs.fragments', {'evals.val.powr': 0.5}, 'not a field of config.eval'),
    ('configs.maskfeat', {'evals.val.powr': 0.5}, 'nor a setting of its evaluator (power)'),
    ('configs.grapheme', {'evals.val.type': 'fragments'}, "expected one of 'grapheme'"),
    ('configs.maskfeat', {'model.name': 'resnet'}, "expected 'vit'"),
    ('configs.maskfeat', {'maskfeat.hog_pool': 3}, 'a divisor of model.args.patch=4'),
    ('configs.maskfeat', {'data.format': 'kaggle'}, "'folder', 'collection', 'tfds'"),
    # The core's own fields (bengrapheme/schema.py, train.check_model): one row each.
    ('configs.grapheme', {'task': 'bengrapheme.grapheme.tsk'}, 'no such module'),
    ('configs.grapheme', {'task': 'bengraphem.grapheme.task'}, 'no such module'),
    ('configs.grapheme', {'seed': -1}, 'an integer in [0, 2**32 - 2]'),
    ('configs.grapheme', {'train.steps': 0}, 'a number of steps >= 1'),
    ('configs.grapheme', {'train.batch_size': 0}, 'a batch size >= 1'),
    ('configs.grapheme', {'train.lr': 0.0}, 'a learning rate > 0'),
    ('configs.grapheme', {'train.warmup_steps': -1}, 'a number of steps >= 0'),
    ('configs.grapheme', {'train.final_lr_fraction': 1.5}, 'a share in [0, 1]'),
    ('configs.grapheme', {'train.weight_decay': -0.1}, '>= 0 (0: none)'),
    ('configs.grapheme', {'train.grad_clip': 0.0}, 'a global gradient norm > 0'),
    ('configs.grapheme', {'train.ema_decay': 1.0}, 'a decay in [0, 1)'),
    ('configs.grapheme', {'train.optimizer': 'adamww'}, "did you mean 'adamw'?"),
    ('configs.grapheme', {'train.optimizer_args': {'eps_rot': 0.0}}, "did you mean 'eps_root'?"),
    ('configs.grapheme', {'train.optimizer': 'sgd', 'train.weight_decay': 0.05},
     'optax.sgd takes no weight_decay'),
    ('configs.grapheme', {'train.schedule': 'cosine_schedule'},
     "did you mean 'cosine_decay_schedule'?"),
    ('configs.grapheme', {'train.schedule_args': {'exponnt': 2.0}}, "did you mean 'exponent'?"),
    ('configs.grapheme', {'train.schedule': 'warmup_exponential_decay_schedule'},
     'needs decay_rate'),
    ('configs.grapheme', {'train.grad_accum_steps': 0}, 'a number of micro-batches >= 1'),
    ('configs.grapheme', {'train.grad_accum_steps': 3}, 'a divisor of train.batch_size=16'),
    ('configs.grapheme', {'train.per_chunk_batch_stats': None}, 'expected True or False'),
    ('configs.fragments', {'train.grad_accum_steps': 2}, 'has BatchNorm'),
    ('configs.grapheme', {'train.groups.trunk': group(lr_scal=0.5)}, "did you mean 'lr_scale'?"),
    ('configs.grapheme', {'train.groups.trunk': {'pattern': 'backbone/.*'}},
     'no lr_scale, frozen_steps; a parameter group has pattern, lr_scale, frozen_steps'),
    ('configs.grapheme', {'train.groups.trunk': group(pattern='(backbone')},
     'not a regular expression'),
    ('configs.grapheme', {'train.groups.trunk': group(lr_scale=-1.0)},
     'a learning-rate factor >= 0'),
    ('configs.grapheme', {'train.groups.trunk': group(frozen_steps=-1)}, 'a number of steps >= 0'),
    ('configs.grapheme', {'train.groups.trunk': group(pattern='backbne/.*')},
     'matches no parameter'),
    ('configs.grapheme', {'train.layer_decay.rate': 0.0}, 'a factor in (0, 1]'),
    ('configs.grapheme', {'train.layer_decay.block': 'backbone/.*'}, 'a (group) capturing'),
    ('configs.grapheme', {'train.layer_decay.stem': '[backbone'}, 'not a regular expression'),
    ('configs.grapheme', {'train.layer_decay.top': '[backbone'}, 'not a regular expression'),
    ('configs.grapheme', {'train.no_decay': 'backbone/pos_embed'}, 'matches no parameter'),
    ('configs.grapheme', {'train.skip_nonfinite': None}, 'expected True or False'),
    ('configs.grapheme', {'train.log_every': 0}, 'a number of steps >= 1'),
    ('configs.grapheme', {'train.checkpoint_every': 0}, 'a number of steps >= 1'),
    ('configs.grapheme', {'train.keep_checkpoints': 0}, 'a number of checkpoints >= 1'),
    ('configs.grapheme', {'train.profile_steps': (5, 2)}, '1 <= first <= last'),
    ('configs.grapheme', {'mesh.fsdp': 0}, 'a number of devices >= 1'),
    ('configs.grapheme', {'mesh.data': 0}, 'or -1'),
    ('configs.grapheme', {'mesh.data': 2}, 'expected 1 devices, those available'),
    ('configs.grapheme', {'eval.batch_size': 0}, 'a batch size >= 1'),
    ('configs.grapheme', {'model.args.widht': 8}, "did you mean 'width'?"),
    ('configs.fragments', {'model.init_from': 'workdirs/absent'}, 'no such workdir'),
]


def with_values(module, values):
  config = importlib.import_module(module).get_config('test')
  with config.unlocked():  # an unknown loss argument can only come from a config file
    for path, value in values.items():
      *parents, name = path.split('.')
      (errors.field(config, '.'.join(parents)) if parents else config)[name] = value
  return config


@pytest.mark.parametrize('module, values, allowed', BAD,
                         ids=[f'{m.split(".")[1]}-{"+".join(v)}' for m, v, _ in BAD])
def test_a_bad_value_is_named_with_what_is_allowed(module, values, allowed):
  config = with_values(module, values)
  with pytest.raises(errors.UserError) as error:
    train.check_init_from(config, train.load_task(config))
  message = str(error.value)
  assert message.startswith(list(values)[-1]), message
  assert allowed in message and '\n' not in message, message


@pytest.mark.slow
def test_every_variant_passes_its_checks():
  for module in ('configs.grapheme', 'configs.fragments', 'configs.maskfeat'):
    for variant in importlib.import_module(module).VARIANTS:
      train.load_task(importlib.import_module(module).get_config(variant))


@pytest.mark.parametrize('command, config, flag', [
    ('launch.train', 'configs/grapheme.py:test', '--config.predict.read=memory'),
    ('launch.train', 'configs/maskfeat.py:test', '--config.maskfeat.hog_pool=3'),
    # Before, a bad export method surfaced only after the whole evaluation had run.
    ('launch.evaluate', 'configs/fragments.py:test', '--config.eval.export_method=best'),
])
@pytest.mark.slow
def test_entry_points_stop_in_one_line_before_any_work(tmp_path, command, config, flag):
  workdir = tmp_path / 'run'
  result = run_module(command, f'--config={config}', flag, '--data', tmp_path,
                      '--workdir', workdir, check=False)
  assert result.returncode == 1, result.stderr[-3000:]
  field = flag.split('=')[0].removeprefix('--config.')
  assert result.stderr.strip().startswith(f'Error: {field}='), result.stderr[-3000:]
  assert 'Traceback' not in result.stderr and len(result.stderr.strip().splitlines()) == 1
  assert not workdir.exists()


@pytest.mark.parametrize('batch_size, devices, accum, message', [
    (18, 4, 1, 'train.batch_size=18: expected a multiple of the 4 devices'),
    (16, 4, 3, 'train.grad_accum_steps=3: expected a divisor of the 4 rows of each device'),
])
def test_a_batch_the_devices_cannot_share_is_named(batch_size, devices, accum, message):
  """What schema.check_mesh asks of the devices (the tests run on one)."""
  from bengrapheme import parallel
  with pytest.raises(errors.ConfigError, match='^' + re.escape(message)):
    parallel.check_batch(batch_size, devices, accum)
  parallel.check_batch(batch_size - batch_size % (devices * accum), devices, accum)


@pytest.mark.parametrize('field, message', [
    ('groups', "train.groups.backbone.pattern='backbne/.*' matches no parameter"),
    ('layer_decay', r"train.layer_decay.block='backbone/block/(\\d+)/.*' matches no "
     "parameter of model.name='cifar_resnet'; its parameters are named like "
     'backbone/blocks/0/conv1/kernel, '),
    ('no_decay', "train.no_decay='backbone/pos_embed' matches no parameter"),
])
def test_a_parameter_pattern_that_matches_nothing_is_named(field, message):
  config = with_values('configs.fragments', {})
  if field == 'groups':
    config.train.groups = dict(backbone=dict(pattern='backbne/.*', lr_scale=0.1,
                                             frozen_steps=0))
  elif field == 'layer_decay':
    config.train.layer_decay.update(rate=0.5, block=r'backbone/block/(\d+)/.*')
  else:
    config.train.no_decay = 'backbone/pos_embed'  # a ViT's; the ResNet has none
  with pytest.raises(errors.ConfigError) as error:
    train.load_task(config)
  assert str(error.value).startswith(message), error.value


def test_a_bad_pattern_is_refused_before_the_patch_cache(tmp_path, fragment_data):
  """On the fragments demo config, in a workdir with no patch cache yet: the refusal comes
  from the model's shapes in load_task, within 10 s, and nothing is built. Counted in CPU
  seconds of the process: the test machine's load would swell its wall-clock time."""
  import resource

  def cpu_seconds():
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime
  began = cpu_seconds()
  result = run_module('launch.train', '--config=configs/fragments.py:demo',
                      '--config.train.no_decay=backbone/pos_embed', '--data', fragment_data,
                      '--workdir', tmp_path / 'run', '--compile_cache=', check=False)
  took = cpu_seconds() - began
  assert result.returncode == 1, result.stderr[-3000:]
  assert result.stderr.strip().startswith("Error: train.no_decay='backbone/pos_embed' matches "
                                          'no parameter'), result.stderr[-3000:]
  assert took < 10, f'refused after {took:.1f} CPU seconds'
  assert not (tmp_path / 'run').exists()


def test_an_evaluator_carries_its_own_settings():
  """The k-NN probe's power is its own setting (its SETTINGS): MaskFeat's config.eval does not
  hold it, its evaluator reads the default, and an entry's own key overrides it."""
  from bengrapheme import evaluators
  config = with_values('configs.maskfeat', {})
  task = train.load_task(config)
  make = evaluators.factory(config, task, 'val')
  assert 'power' not in config.eval
  assert evaluators.own_config(config, 'val', make).eval.power == 0.4
  config = with_values('configs.maskfeat', {'evals.val.power': 0.7})
  train.load_task(config)
  assert evaluators.own_config(config, 'val', make).eval.power == 0.7
