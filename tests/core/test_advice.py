"""Advice that works: an error that suggests a flag or a command is followed here as written,
and the suggestion gets past that error."""
import ast
import importlib
import json
import os
import pathlib
import re
import sqlite3

import numpy as np
import pytest

from bengrapheme import errors, evaluators, train
from conftest import ROOT, run_module

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_an_empty_val_split_is_filled_either_way_said(grapheme_data, tmp_path):
  from bengrapheme.grapheme import data
  values = {'data.dir': grapheme_data, 'data.val_fraction': 0.0, 'unseen.val_graphemes': 0}
  with pytest.raises(ValueError) as refused:
    data.source(config_of('configs.grapheme', **values), str(tmp_path), 'val')
  said = re.findall(r'set config\.([\w.]+) > 0|or config\.([\w.]+) > 0', str(refused.value))
  said = [a or b for a, b in said]
  assert said == ['data.val_fraction', 'unseen.val_graphemes'], refused.value
  for path, value in zip(said, (0.2, 2)):  # each alternative alone, a value above 0
    config = config_of('configs.grapheme', **{**values, path: value})
    assert len(data.source(config, str(tmp_path / path), 'val')) > 0


@pytest.mark.slow
def test_without_the_march_2020_files_train_csv_labels_are_read_as_said(grapheme_data,
                                                                      tmp_path):
  import shutil
  from bengrapheme.grapheme import data, kaggle
  folder = tmp_path / 'kaggle'
  shutil.copytree(grapheme_data, folder)
  os.remove(folder / kaggle.MULTI_DIACRITICS)
  config = config_of('configs.grapheme', **{'data.dir': str(folder),
                                            'data.corrected_labels': True})
  with pytest.raises(kaggle.DataError) as refused:
    data.source(config, str(tmp_path / 'a'), 'train')
  (path, value), = flags_in(str(refused.value).replace('set config.', '--config.')).items()
  errors.field(config, path.rsplit('.', 1)[0])[path.rsplit('.', 1)[1]] = value
  assert len(data.source(config, str(tmp_path / 'b'), 'train')) > 0


@pytest.mark.slow
@pytest.mark.parametrize('generator', ['grapheme', 'grapheme_family', 'fragments',
                                       'fragment_family'])
def test_a_generator_writes_into_a_new_out_as_said(generator, tmp_path):
  """Each generator refuses a folder that holds files; the new folder it asks for is written."""
  import importlib
  module, kwargs = {
      'grapheme': ('bengrapheme.grapheme.synth', dict(num_train=2, num_test=2, workers=1)),
      'grapheme_family': ('bengrapheme.grapheme.synth_val', dict(num=2, workers=1)),
      'fragments': ('retrieval.synthetic.synth', dict(writers_train=1, writers_test=1,
                                                      pages_per_writer=1,
                                                      page_size=(300, 400))),
      'fragment_family': ('retrieval.synthetic.synth_val', dict(writers=1, pages_per_writer=1,
                                                                page_size=(300, 400))),
  }[generator]
  write = importlib.import_module(module).write_dataset
  full = tmp_path / 'full'
  full.mkdir()
  (full / 'notes.txt').write_text('mine')
  with pytest.raises(errors.NotEmpty) as refused:
    write(str(full), **kwargs)
  assert (full / 'notes.txt').read_text() == 'mine' and os.listdir(full) == ['notes.txt']
  assert 'choose a new --out' in str(refused.value) or 'expected a new or empty folder' in str(
      refused.value)
  write(str(tmp_path / 'new'), **kwargs)
  assert os.listdir(tmp_path / 'new')


def test_another_decisions_database_is_used_as_said(tmp_path):
  from retrieval.collections import decisions
  for bad, make in ((tmp_path / 'nowhere' / 'd.sqlite', None),
                    (tmp_path / 'notes.txt', lambda p: p.write_text('shelf marks')),
                    (tmp_path / 'other.sqlite', lambda p: sqlite3.connect(p).execute(
                        'CREATE TABLE t (x)').connection.commit())):
    if make:
      make(bad)
    with pytest.raises(errors.UserError) as refused:
      decisions.Decisions(str(bad))
    assert re.search(r'give another --db|a path for the decisions database \(--db\)',
                     str(refused.value)), refused.value
  store = decisions.Decisions(str(tmp_path / 'decisions.sqlite'))  # another --db
  assert os.path.isfile(store.path)


@pytest.mark.parametrize('module, variant', [('configs.grapheme', 'test'),
                                             ('configs.fragments', 'test'),
                                             ('configs.fragments', 'size=test,data=collection')])
def test_no_data_is_given_as_said(module, variant, grapheme_data, fragment_data):
  """`--data DIR` sets config.data.dir: the check every entry point runs before its work."""
  config = config_of(module, variant)
  config.data.dir = ''
  task = train.load_task(config)
  with pytest.raises(Exception) as refused:
    task.check_data(config)
  assert 'no data: pass --data DIR' in str(refused.value), refused.value
  data = grapheme_data if module == 'configs.grapheme' else fragment_data
  config.data.dir = data if 'collection' not in variant else f'{data}/test'
  task.check_data(config)


@pytest.mark.slow
def test_writer_classes_are_counted_from_the_data_as_said(fragment_data):
  from flax import nnx
  from retrieval.writer_id import model
  config = config_of('configs.writer_id', 'test', **{'model.num_writers': 0, 'data.dir': ''})
  with pytest.raises(errors.ConfigError, match="pass --data, or set it"):
    model.make_model(config, nnx.Rngs(0))
  config.data.dir = fragment_data  # --data
  assert model.make_model(config, nnx.Rngs(0)).head.out_features == 6  # its train writers
  config = config_of('configs.writer_id', 'test', **{'model.num_writers': 3, 'data.dir': ''})
  assert model.make_model(config, nnx.Rngs(0)).head.out_features == 3  # or set it


def test_decisions_train_with_the_collection_config_said(tmp_path):
  import configs.fragments
  from retrieval.fragments import data
  from PIL import Image
  config = configs.fragments.get_config('test')
  config.data.decisions = str(tmp_path / 'd.sqlite')
  with pytest.raises(errors.ConfigError) as refused:
    data.check_data(config)
  (variant,) = re.findall(r'--config configs/fragments\.py:(\S+)', str(refused.value))
  config = configs.fragments.get_config(variant)
  Image.new('L', (40, 30), 200).save(tmp_path / 'leaf.png')
  config.data.update(decisions=str(tmp_path / 'd.sqlite'), dir=str(tmp_path))
  data.check_data(config)


@pytest.mark.slow  # a short training run and two evaluations
def test_an_untrained_workdir_trains_as_said_then_evaluates(grapheme_data, tmp_path):
  workdir = tmp_path / 'run'
  evaluate = ['launch.evaluate', '--config=configs/grapheme.py:test', '--data', grapheme_data,
              '--workdir', workdir]
  for missing in ('no such folder; expected the workdir of a training run',
                  'train first (python -m launch.train ... --workdir'):
    refused = run_module(*evaluate, check=False)
    assert refused.returncode == 1 and missing in refused.stderr, refused.stderr[-2000:]
    workdir.mkdir(exist_ok=True)  # the second: a folder with no checkpoint
  (said,) = re.findall(r'\(python -m (launch\.train \.\.\. --workdir \S+)\)', refused.stderr)
  module, _, *rest = said.split()  # '...': the config and data, as evaluate was given them
  run_module(module, '--config=configs/grapheme.py:test', '--data', grapheme_data,
             '--config.train.steps=2', *rest)
  run_module(*evaluate)


@pytest.mark.slow  # a training run, a rerun and an evaluation
def test_class_counts_are_written_again_by_the_training_command_as_said(grapheme_data,
                                                                       tmp_path):
  """The prior correction and val's tuning of it read the training stream's class counts; a
  workdir without them (copied without the file) gets them from its training command."""
  from bengrapheme.grapheme import data
  workdir = tmp_path / 'run'
  args = ['--config=configs/grapheme.py:test', '--data', grapheme_data, '--workdir', workdir,
          '--config.train.steps=2']
  run_module('launch.train', *args)
  os.remove(workdir / data.CLASS_COUNTS)
  refused = run_module('launch.evaluate', *args, check=False)
  assert refused.returncode == 1, refused.stdout[-2000:]
  assert refused.stderr.strip().splitlines()[-1].endswith(
      'rerun the launch.train command of this workdir (at its last step it writes the file '
      'and trains no further)'), refused.stderr[-2000:]
  assert 'Traceback' not in refused.stderr
  trained = run_module('launch.train', *args)  # as said
  assert (workdir / data.CLASS_COUNTS).exists() and 'step 3' not in trained.stdout
  run_module('launch.evaluate', *args)


@pytest.mark.slow  # an evaluation
def test_an_export_of_an_unchosen_method_is_evaluated_with_its_tuning_split_as_said(
    fragment_evaluated, fragment_data, tmp_path):
  import shutil
  workdir = tmp_path / 'run'
  shutil.copytree(fragment_evaluated, workdir)
  shutil.rmtree(workdir / 'eval')
  args = ['launch.evaluate', '--data', fragment_data, '--workdir', workdir]
  refused = run_module(*args, '--evals', 'test', check=False)
  assert refused.returncode == 1, refused.stdout[-2000:]
  said = re.search(r"evaluate eval\.tune_split='(\w+)'.s entry in the same run \(launch\."
                   r'evaluate without --evals, or naming it too\)', refused.stderr)
  assert said, refused.stderr
  run_module(*args, '--evals', f'{said.group(1)},test')  # naming it too
  assert (workdir / 'eval' / 'distances_test.npy').exists()


@pytest.mark.slow  # two short training runs
def test_the_vit_recipe_starts_from_the_pre_training_it_names(fragment_data, tmp_path):
  """The ViT recipe's model.init_from names a workdir that is not there: the pre-training
  command it names (DATA: the folder) makes it, and the fine-tune then starts from it."""
  pre = tmp_path / 'maskfeat'
  fine = ['launch.train', '--config=configs/fragments.py:recipe=saghog,size=test', '--data',
          fragment_data, '--workdir', tmp_path / 'fine', f'--config.model.init_from={pre}',
          '--config.train.steps=2']
  refused = run_module(*fine, check=False)
  assert refused.returncode == 1, refused.stdout[-2000:]
  (said,) = re.findall(r'python -m (launch\.train --config \S+ --data DATA --workdir [^\s)]+)',
                       refused.stderr)
  assert 'configs/maskfeat.py:test' in said  # the pre-training of this size's trunk
  run_module(*said.replace('DATA', fragment_data).split(), '--config.train.steps=2')
  run_module(*fine)


def test_pages_cut_again_into_the_emptied_folder_as_said(tmp_path, monkeypatch):
  """Ctrl-C while cutting pages leaves the fragments cut so far; emptied as said, the rerun
  cuts them all."""
  import shutil
  from PIL import Image
  from retrieval.synthetic import fragments
  pages, out = tmp_path / 'pages', tmp_path / 'out'
  pages.mkdir()
  page = np.full((400, 300), 230, np.uint8)
  page[40:360:12, 30:270] = 20  # lines of ink
  for writer in (1, 2):
    Image.fromarray(page).save(pages / f'{writer}_1.png')
  run_jobs = fragments.run_jobs

  def stopped_after_one(fn, jobs, *args):
    run_jobs(fn, jobs[:1], *args)
    raise KeyboardInterrupt

  monkeypatch.setattr(fragments, 'run_jobs', stopped_after_one)
  with pytest.raises(errors.Interrupted, match='empty it before rerunning'):
    fragments.fragment_pages(str(pages), str(out), fragments.FragmentParams())
  with pytest.raises(errors.NotEmpty):  # not emptied: refused
    fragments.fragment_pages(str(pages), str(out), fragments.FragmentParams())
  monkeypatch.setattr(fragments, 'run_jobs', run_jobs)
  for path in out.iterdir():  # emptied, as said
    os.remove(path) if path.is_file() else shutil.rmtree(path)
  count = fragments.fragment_pages(str(pages), str(out), fragments.FragmentParams())
  assert count == len(os.listdir(out)) > 0


# ------------------------------------------------ every suggestion is followed by a test
# Each message of the project that tells the user what to do (run a command, set a flag or
# a field, rerun) is found by `advising_messages` and must hold a phrase of FOLLOWED, whose
# test follows it as written and sees it get past the error; or of NAMES_WHAT_IS_ACCEPTED
# (it names a flag only to list what the flag accepts); or of NOT_FOLLOWED_HERE, with why.
ADVISES = re.compile(r'python -m |--[a-z]|\brerun|\bset (--)?config\.|\bpass --')
HERE = 'tests/core/test_advice.py::'
REINDEX = 'tests/workbench/test_reindex_as_said.py::'
FOLLOWED = {
    'rerunning builds it again': 'tests/core/test_prepared_data.py::'
                                 'test_ctrl_c_while_building_says_so_and_leaves_nothing',
    'Free space there (or set config.data.cache_dir': 'tests/core/test_prepared_data.py::'
        'test_out_of_space_leaves_nothing_and_a_rerun_builds',
    'Free space (or keep fewer checkpoints': 'tests/core/test_resume.py::'
        'test_full_disk_stops_naming_the_space_left_and_the_rerun_resumes',
    'expected the workdir of a training run (python -m launch.train':
        HERE + 'test_an_untrained_workdir_trains_as_said_then_evaluates',
    'train first (python -m launch.train': HERE + 'test_an_untrained_workdir_trains_as_said_then_'
                                                  'evaluates',
    'Use a new --workdir, or the config the checkpoint was trained with':
        HERE + 'test_a_workdir_indexes_and_evaluates_with_its_own_config',
    'set --config.data.cache_dir=/local/folder':
        HERE + 'test_a_bucket_workdir_prepares_its_data_where_said',
    'rerun the launch.train command of this workdir':
        HERE + 'test_class_counts_are_written_again_by_the_training_command_as_said',
    "set config.data.format='kaggle' or config.data.corrected_labels=False":
        'tests/core/test_tfds.py::test_corrected_labels_with_a_build_are_read_either_way_said',
    "split 'val' is empty: set config.data.val_fraction > 0":
        HERE + 'test_an_empty_val_split_is_filled_either_way_said',
    'in March 2020), or set config.data.corrected_labels=False':
        HERE + 'test_without_the_march_2020_files_train_csv_labels_are_read_as_said',
    'or train on the real images alone: --config.render.fraction=0':
        HERE + 'test_without_the_fonts_training_on_the_real_images_alone_works_as_said',
    'choose a new --out': HERE + 'test_a_generator_writes_into_a_new_out_as_said',
    'nothing was left there; rerun to write it': 'tests/core/test_cli_errors.py::'
        'test_ctrl_c_while_writing_data_is_one_line_and_leaves_nothing',
    'TFDS build; make one with `python -m': 'tests/core/test_tfds.py::'
        'test_the_missing_build_is_made_with_the_command_it_names',
    'set --config.train.weight_decay=0': HERE + 'test_each_suggested_flag_gets_past_the_error',
    'rerun it when the sweep has finished': 'tests/core/test_sweep.py::'
        'test_a_test_report_asked_while_another_process_sweeps_is_given_after_it_as_said',
    'sweep into another --workdir': 'tests/core/test_sweep.py::'
        'test_a_workdir_of_another_sweep_is_refused_and_another_workdir_sweeps',
    'rerun the same command to resume the sweep': 'tests/core/test_sweep.py::'
        'test_a_preempted_sweep_resumes_when_the_same_command_is_rerun',
    'stopped at once: ; rerun the same command to resume': 'tests/core/test_resume.py::'
        'test_ctrl_c_before_the_first_step_stops_at_once_and_the_rerun_trains',
    'accept that with --config.train.per_chunk_batch_stats=True':
        HERE + 'test_each_suggested_flag_gets_past_the_error',
    'Interrupted: saved step ; rerun the same command': 'tests/core/test_resume.py::'
        'test_ctrl_c_saves_the_current_step_and_the_rerun_resumes',
    'is in use by another training run': 'tests/core/test_workdir_lock.py::'
        'test_second_run_refused_while_the_first_trains_and_evaluate_reads_beside_it',
    'give another --db': HERE + 'test_another_decisions_database_is_used_as_said',
    'expected a path for the decisions database (--db)':
        HERE + 'test_another_decisions_database_is_used_as_said',
    'no index; build it first (python -m launch.index':
        HERE + 'test_a_workdir_indexes_and_evaluates_with_its_own_config',
    'rerun the same command to go on': 'tests/retrieval/test_index_search.py::'
        'test_an_interrupted_index_keeps_its_chunks_and_the_rerun_goes_on',
    'rerun python -m launch.index on its folder to bring the index up to date':
        REINDEX + 'test_a_search_over_a_removed_image_or_a_damaged_index_runs_after_reindexing',
    'rebuild it with python -m launch.index':
        REINDEX + 'test_a_search_over_a_removed_image_or_a_damaged_index_runs_after_reindexing',
    'rerun launch.index to rebuild it': 'tests/retrieval/test_index_search.py::'
        'test_another_checkpoint_at_the_same_step_is_not_taken_for_the_indexed_one',
    'rerun python -m launch.index, then decide on what it shows now':
        REINDEX + 'test_a_changed_or_unreadable_image_is_decided_on_after_reindexing',
    'changed since it was indexed?); rerun python -m launch.index on its folder':
        REINDEX + 'test_a_changed_or_unreadable_image_is_decided_on_after_reindexing',
    ': unreadable (); rerun python -m launch.index on its folder':
        REINDEX + 'test_a_changed_or_unreadable_image_is_decided_on_after_reindexing',
    '(launch.serve --max_upload_mb)': 'tests/workbench/test_safety.py::'
        'test_bad_uploads_are_refused_in_one_message_and_nothing_is_stored',
    'use --config configs/fragments.py:data=collection':
        HERE + 'test_decisions_train_with_the_collection_config_said',
    'no data: pass --data DIR': HERE + 'test_no_data_is_given_as_said',
    "entry in the same run (launch.evaluate without --evals, or naming it too)":
        HERE + 'test_an_export_of_an_unchosen_method_is_evaluated_with_its_tuning_split_as_said',
    'train without evaluations (': HERE + 'test_a_collection_trains_without_evaluations_as_said',
    "MaskFeat's pre-training: python -m launch.train":
        HERE + 'test_the_vit_recipe_starts_from_the_pre_training_it_names',
    'lower it (--config.train.batch_size=': HERE + 'test_a_maskfeat_batch_lowered_as_said_trains',
    'empty it before rerunning': HERE + 'test_pages_cut_again_into_the_emptied_folder_as_said',
    "pass --data, or set it": HERE + 'test_writer_classes_are_counted_from_the_data_as_said',
    'has no config.json (its training run writes one): give the config':
        HERE + 'test_no_config_and_no_config_json_says_to_give_the_config',
    'python -m launch.evaluate writes its scores and exports':
        'tests/retrieval/test_retrieval_task.py::'
        'test_predict_says_in_one_line_that_fragments_have_no_predictor',
    'pick another --port': 'tests/workbench/test_safety.py::'
                           'test_serve_beyond_loopback_prints_a_token_and_requires_it',
}
NAMES_WHAT_IS_ACCEPTED = (
    '--stages: unknown', '--sweep :  declares', '--report_test: no trial has finished',
    '--report_test: config.evals has no entry', '--size : expected at least 16',
    '--manifest : no such file, nor a URL', "expected the workbench's decisions database",
    '--evals : expected one of', '--workdir is required', 'flag --config: give the config file',
    'give either --query', '--dry_run_devices: jax was started', '--dry_run_devices: only with',
    '--dry_run and --feed_check: one at a time', '--python-version : expected MAJOR.MINOR',
    'pip wheel --no-deps  failed', 'does not resolve from the wheelhouse alone',
)
NOT_FOLLOWED_HERE = {
    'an index is written to a local folder; pass --index DIR':
        'the workdir is a cloud bucket, which the tests do not have',
    'Pick a --python-version / --platform it publishes wheels for':
        'needs the package index, which the tests do not reach',
    'or pick a --python-version / --platform that':
        'needs the package index, which the tests do not reach',
}


def advising_messages():
  """{'file:line': text} of every message that advises: built as an exception (or in one's
  __init__), said on Ctrl-C, or returned as advice; text: its string parts, values left out."""
  found = {}
  for top in ('bengrapheme', 'retrieval', 'launch'):
    for path in sorted(pathlib.Path(ROOT, top).rglob('*.py')):
      for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
          f = node.func
          name = f.attr if isinstance(f, ast.Attribute) else getattr(f, 'id', '')
          if not (name[:1].isupper() or name in ('on_ctrl_c', '__init__')) or name.startswith(
              ('DEFINE', 'ArgumentParser')):
            continue
        elif not (isinstance(node, ast.Return) and isinstance(node.value,
                                                                (ast.JoinedStr, ast.BinOp))):
          continue
        text = ''.join(n.value for n in ast.walk(node)
                       if isinstance(n, ast.Constant) and isinstance(n.value, str))
        if ADVISES.search(text):
          found[f'{path.relative_to(ROOT)}:{node.lineno}'] = text
  return found


def unaccounted(messages):
  known = (*FOLLOWED, *NAMES_WHAT_IS_ACCEPTED, *NOT_FOLLOWED_HERE)
  return {where: text for where, text in messages.items()
          if not any(phrase in text for phrase in known)}


def test_every_advising_message_is_followed_by_a_named_test():
  messages = advising_messages()
  assert unaccounted(messages) == {}, (
      'a message advises the user with no test that follows it: add a phrase of it to FOLLOWED '
      'with the test that does what it says and gets past the error (or to '
      'NAMES_WHAT_IS_ACCEPTED when it only lists what a flag takes)')
  known = (*FOLLOWED, *NAMES_WHAT_IS_ACCEPTED, *NOT_FOLLOWED_HERE)
  stale = [p for p in known if not any(p in text for text in messages.values())]
  assert stale == []  # each phrase still names a message
  for test in set(FOLLOWED.values()):
    path, name = test.split('::')
    assert re.search(rf'^def {name}\(', pathlib.Path(ROOT, path).read_text(), re.M), test


def test_a_new_advising_message_without_a_test_is_found(tmp_path, monkeypatch):
  messages = dict(advising_messages(), **{'new.py:1': 'x: bad; rerun with --config.new=1'})
  assert list(unaccounted(messages)) == ['new.py:1']
