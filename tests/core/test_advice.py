"""Advice that works: an error that suggests a flag or a command is followed here as written,
and the suggestion gets past that error."""
import ast
import importlib
import json
import re

import pytest

from bengrapheme import errors, evaluators, train
from conftest import run_module

FLAG = re.compile(r'--config\.([\w.]+)=(\S+?)(?=[\s),;]|$)')


def config_of(module, variant='test', **values):
  config = importlib.import_module(module).get_config(variant)
  for path, value in values.items():
    *parents, name = path.split('.')
    errors.field(config, '.'.join(parents))[name] = value
  return config


def flags_in(message):
  """{path: value} of each --config.PATH=VALUE the message suggests."""
  found = {}
  for path, value in FLAG.findall(message):
    try:
      found[path] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      found[path] = value
  assert found, f'no --config flag in {message!r}'
  return found


@pytest.mark.parametrize('module, variant, values', [
    # Gradient caching with BatchNorm, on the default fragment encoder: accept per-chunk
    # statistics, or no accumulation.
    ('configs.fragments', 'demo', {'train.grad_accum_steps': 2}),
    # An optimizer without weight decay: no decay.
    ('configs.grapheme', 'test', {'train.optimizer': 'sgd'}),
])
def test_each_suggested_flag_gets_past_the_error(module, variant, values):
  with pytest.raises(errors.ConfigError) as refused:
    train.load_task(config_of(module, variant, **values))
  for path, value in flags_in(str(refused.value)).items():  # each alternative alone
    train.load_task(config_of(module, variant, **{**values, path: value}))


def test_a_schedule_argument_train_does_not_give_is_given_as_said():
  values = {'train.schedule': 'warmup_exponential_decay_schedule'}
  with pytest.raises(errors.ConfigError) as refused:
    train.load_task(config_of('configs.grapheme', **values))
  said = re.search(r'c\.train\.schedule_args = dict\((\w+)=\.\.\.\)', str(refused.value))
  config = config_of('configs.grapheme', **values)
  config.train.schedule_args = {said.group(1): 0.5}
  train.load_task(config)


def test_a_collection_trains_without_evaluations_as_said(tmp_path, fragment_data):
  """MaskFeat's demo on a collection: no split can be scored; the flags it names leave
  nothing to score during training."""
  config = config_of('configs.maskfeat', 'demo', **{'data.format': 'collection',
                                                    'data.dir': f'{fragment_data}/test'})
  task = train.load_task(config)
  with pytest.raises(errors.UserError) as refused:
    evaluators.make(config, task, str(tmp_path), evaluators.in_training(config))
  for path, value in flags_in(str(refused.value)).items():
    errors.field(config, path.rsplit('.', 1)[0])[path.rsplit('.', 1)[1]] = value
  assert evaluators.make(config, task, str(tmp_path), evaluators.in_training(config)) == {}


def test_no_config_and_no_config_json_says_to_give_the_config(tmp_path, fragment_data):
  workdir = tmp_path / 'empty'
  workdir.mkdir()
  refused = run_module('launch.evaluate', '--data', fragment_data, '--workdir', workdir,
                       check=False)
  assert refused.returncode == 1
  assert refused.stderr.strip() == (f'Error: {workdir} has no config.json (its training run '
                                    'writes one): give the config, e.g. --config '
                                    'configs/fragments.py:demo'), refused.stderr
  followed = run_module('launch.evaluate', '--config', 'configs/fragments.py:test', '--data',
                        fragment_data, '--workdir', workdir, check=False)
  assert 'has no config.json' not in followed.stderr
  assert 'no checkpoint' in followed.stderr  # the next error: nothing trained there


@pytest.mark.slow  # two training runs (about a minute each on 2 cores)
@pytest.mark.parametrize('variant', ['test', 'size=test,data=collection'])
def test_a_workdir_indexes_and_evaluates_with_its_own_config(tmp_path, fragment_data, variant):
  """A run of each fragments variant, never evaluated: launch.index with no --config reads
  its config.json and indexes with the config's own settings, saying so in one line. With a
  config of another model the checkpoint is refused, naming config.json; leaving --config
  out, as said, gets past that. launch.evaluate reads config.json too."""
  workdir = tmp_path / 'run'
  data = fragment_data if variant == 'test' else f'{fragment_data}/train'
  run_module('launch.train', f'--config=configs/fragments.py:{variant}', '--data', data,
             '--workdir', workdir)
  collection = f'{fragment_data}/test'
  refused = run_module('launch.index', f'--config=configs/fragments.py:{variant}',
                       '--config.model.embedding_dim=32', '--workdir', workdir, '--collection',
                       collection, check=False)
  assert refused.returncode == 1, refused.stdout[-2000:]
  assert "launch.index read it when --config is left out" in refused.stderr, refused.stderr
  unindexed = run_module('launch.search', '--workdir', workdir, '--query-collection',
                         check=False)
  assert unindexed.returncode == 1 and re.search(
      r'no index; build it first \(python -m launch\.index --workdir W --collection DIR\)',
      unindexed.stderr), unindexed.stderr
  indexed = run_module('launch.index', '--workdir', workdir, '--collection', collection)
  said = indexed.stdout + indexed.stderr
  searched = run_module('launch.search', '--workdir', workdir, '--query-collection')
  assert 'Page:' in searched.stdout
  assert f'Using the config the checkpoints were trained with: {workdir}/config.json' in said
  if variant == 'test':  # its val split would choose the post-processing: not recorded yet
    assert re.search(r"Settings chosen on the config, as no choice on split 'val' is recorded "
                     r'for the checkpoint of step \d+ \(python -m launch\.evaluate --data DATA '
                     fr'--workdir {workdir} records one\)', said), said
    evaluated = run_module('launch.evaluate', '--data', data, '--workdir', workdir)
    assert 'Using the config the checkpoints were trained with' in (evaluated.stdout +
                                                                    evaluated.stderr)
    assert (workdir / 'eval' / 'metrics.json').exists()
  else:
    assert 'Settings chosen on the config (it names no split to tune on)' in said, said


@pytest.mark.slow  # a short training run
def test_without_the_fonts_training_on_the_real_images_alone_works_as_said(tmp_path,
                                                                          grapheme_data):
  command = ['launch.train', '--config=configs/grapheme.py:test', '--data', grapheme_data,
             '--workdir', tmp_path / 'run']
  env = {'BENGRAPHEME_GOOGLE_FONTS': '/nonexistent/google-fonts'}
  refused = run_module(*command, env=env, check=False)
  assert refused.returncode == 1, refused.stdout[-2000:]
  (flag,) = re.findall(r'--config\.render\.fraction=\S+', refused.stderr)
  trained = run_module(*command, flag, env=env, check=False)
  assert trained.returncode == 0, trained.stderr[-3000:]


@pytest.mark.slow  # a short training run
def test_a_maskfeat_batch_lowered_as_said_trains(tmp_path, fragment_data):
  command = ['launch.train', '--config=configs/maskfeat.py:test', '--data', fragment_data,
             '--workdir', tmp_path / 'run', '--config.train.steps=2']
  refused = run_module(*command, '--config.train.batch_size=100000', check=False)
  assert refused.returncode == 1, refused.stdout[-2000:]
  (flag,) = re.findall(r'--config\.train\.batch_size=\d+', refused.stderr)
  trained = run_module(*command, flag, check=False)
  assert trained.returncode == 0, trained.stderr[-3000:]


def test_a_bucket_workdir_prepares_its_data_where_said(tmp_path):
  from bengrapheme import files
  config = config_of('configs.grapheme')
  with pytest.raises(errors.ConfigError) as refused:
    files.prepared_dir(config, 'gs://bucket/run')
  (path, value), = flags_in(str(refused.value)).items()
  assert path == 'data.cache_dir' and value == '/local/folder'
  config.data.cache_dir = str(tmp_path / 'local')  # the folder the user names
  assert files.prepared_dir(config, 'gs://bucket/run') == str(tmp_path / 'local')


def test_a_workdirs_config_json_reads_back_as_the_config_saved(tmp_path):
  """What launch.evaluate and launch.index use when --config is left out: every variant's
  config.json reads back equal (sequences as tuples) and locked, as its config file gives it."""
  for module in ('configs.grapheme', 'configs.fragments', 'configs.maskfeat', 'configs.writer_id'):
    for variant in importlib.import_module(module).VARIANTS:
      config = config_of(module, variant)
      workdir = tmp_path / f'{module}-{variant}'
      train.save_config(config, str(workdir))
      read = train.read_config(str(workdir))
      assert read.to_dict() == config.to_dict(), (module, variant)
      assert read.is_locked
  assert train.read_config(str(tmp_path / 'none')) is None
