"""TFDS builds of both datasets, read back without TensorFlow: the same records as the direct
readers, through the same grain pipelines."""
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bengrapheme import errors, train
from bengrapheme.grapheme import data as grapheme_task, kaggle, tfds_bengaliai
from configs import fragments as fragment_configs, grapheme as grapheme_configs
from retrieval.fragments import data as fragment_task, reader, tfds_hisfrag20

from conftest import run_module


@pytest.fixture(scope='module')
def tfds_dir(grapheme_data, fragment_data, tmp_path_factory):
  out = str(tmp_path_factory.mktemp('tfds'))
  tfds_bengaliai.build(grapheme_data, out)
  tfds_hisfrag20.build(fragment_data, out)
  return out


def configs(module, data, tfds_dir, direct_format):
  """The test config reading `data` directly, and the same reading the TFDS build."""
  direct, built = module.get_config('test'), module.get_config('test')
  direct.data.update(dir=data, format=direct_format)
  built.data.update(format='tfds', tfds_dir=tfds_dir)
  if 'corrected_labels' in direct.data:  # the build holds train.csv's labels, not the update
    direct.data.corrected_labels = built.data.corrected_labels = False
  return direct, built


def assert_same_records(a, b):
  assert len(a) == len(b)
  for i in range(len(a)):
    x, y = a[i], b[i]
    assert sorted(x) == sorted(y)
    for key in x:
      assert np.asarray(x[key]).dtype == np.asarray(y[key]).dtype, key
      np.testing.assert_array_equal(x[key], y[key], err_msg=f'record {i}: {key}')


def assert_same_first_batches(a, b):
  x, y = next(iter(a)), next(iter(b))
  assert sorted(x) == sorted(y)
  for key in x:
    np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.slow
def test_bengaliai_matches_the_kaggle_reader(grapheme_data, tfds_dir, tmp_path):
  direct, built = configs(grapheme_configs, grapheme_data, tfds_dir, 'kaggle')
  for split in ('train', 'val', 'test'):  # val: the same hold-out of the same row order
    expected = grapheme_task.source(direct, str(tmp_path), split)
    got = grapheme_task.source(built, str(tmp_path), split)
    assert_same_records(expected, got)  # images bitwise, labels, grapheme ids, row index
  assert got.image_ids == expected.image_ids  # test: what predict orders the submission by
  # The records as tfds.data_source gives them: ids and grapheme strings in row order, and
  # the synthetic test split's answers (Kaggle's would be -1).
  records = tfds.data_source('bengaliai', split='test', data_dir=tfds_dir, download=False)
  assert [r['image_id'].decode() for r in records] == expected.image_ids
  assert [r['grapheme'].decode() for r in records] == expected.graphemes
  assert min(r['grapheme_root'] for r in records) >= 0

  assert_same_first_batches(grapheme_task.train_data(direct, str(tmp_path), 8),
                            grapheme_task.train_data(built, str(tmp_path), 8))


@pytest.mark.slow
def test_hisfrag20_matches_the_folder_reader(fragment_data, tfds_dir, tmp_path):
  direct, built = configs(fragment_configs, fragment_data, tfds_dir, 'folder')
  for split in ('train', 'val', 'test'):  # val: writers of train/ held out of training
    expected = fragment_task.source(direct, str(tmp_path / 'folder'), split)
    got = fragment_task.source(built, str(tmp_path / 'tfds'), split)
    assert got.names == expected.names
    assert_same_records(expected, got)  # fitted fragments decoded from the same JPEG bytes
  for split in ('train', 'test'):
    records = tfds.data_source('hisfrag20', split=split, data_dir=tfds_dir, download=False,
                               decoders={'image': tfds.decode.SkipDecoding()})
    names = [os.path.basename(f.path)
             for f in reader.list_fragments(os.path.join(fragment_data, split))]
    assert len(names) == len(records)
    for name, record in zip(names, records):
      assert record['file_name'].decode() == name
      assert (record['writer'], record['page'], record['fragment']) == reader.parse_name(name)
      with open(os.path.join(fragment_data, split, name), 'rb') as f:
        assert record['image'] == f.read()

  assert_same_first_batches(fragment_task.train_data(direct, str(tmp_path / 'folder'), 16),
                            fragment_task.train_data(built, str(tmp_path / 'tfds'), 16))


def test_builders_report_bad_input_as_the_readers_do(grapheme_data, fragment_data, tmp_path):
  bengali = tmp_path / 'bengali'
  shutil.copytree(grapheme_data, bengali, copy_function=os.link)
  os.remove(bengali / 'train.csv')
  with open(os.path.join(grapheme_data, 'train.csv'), encoding='utf-8') as f:
    lines = f.readlines()
  fields = lines[3].split(',')
  lines[3] = ','.join([fields[0], '999'] + fields[2:])  # grapheme_root out of range
  (bengali / 'train.csv').write_text(''.join(lines), encoding='utf-8')
  with pytest.raises(kaggle.DataError, match='line 4 .*grapheme_root 999 is out of range'):
    tfds_bengaliai.build(str(bengali), str(tmp_path / 'out'))

  hisfrag = tmp_path / 'hisfrag'
  shutil.copytree(fragment_data, hisfrag, copy_function=os.link)
  (hisfrag / 'test' / 'notes.txt').write_text('stray')
  with pytest.raises(reader.DataError, match='notes.txt: expected a fragment named'):
    tfds_hisfrag20.build(str(hisfrag), str(tmp_path / 'out'))
  os.remove(hisfrag / 'test' / 'notes.txt')
  (hisfrag / 'train' / '1_1_99.jpg').write_bytes(b'not a jpeg')
  with pytest.raises(reader.DataError, match='1_1_99.jpg: unreadable image'):
    tfds_hisfrag20.build(str(hisfrag), str(tmp_path / 'out'))


def test_tfds_format_needs_a_build(tmp_path):
  for module, name in ((grapheme_configs, grapheme_task), (fragment_configs, fragment_task)):
    config = module.get_config('test')
    config.data.format = 'tfds'
    with pytest.raises(errors.ConfigError, match='needs data.tfds_dir'):
      train.load_task(config)  # every entry point's check, before any data work
    config.data.tfds_dir = str(tmp_path / 'empty')
    with pytest.raises(FileNotFoundError, match='no .* TFDS build; make one with'):
      name.source(config, str(tmp_path), 'test')


@pytest.mark.slow
@pytest.mark.parametrize('module, task, data', [(grapheme_configs, grapheme_task, 'grapheme_data'),
                                                 (fragment_configs, fragment_task, 'fragment_data')])
def test_the_missing_build_is_made_with_the_command_it_names(module, task, data, tmp_path,
                                                            request):
  data = request.getfixturevalue(data)
  config = module.get_config('test')
  config.data.update(format='tfds', tfds_dir=str(tmp_path / 'tfds'))
  if 'corrected_labels' in config.data:
    config.data.corrected_labels = False
  with pytest.raises(FileNotFoundError) as refused:
    task.source(config, str(tmp_path), 'test')
  (command,) = re.findall(r'`python -m ([^`]+)`', str(refused.value))
  run_module(*command.replace('DATA', data).split())  # as written, DATA being the folder
  assert len(task.source(config, str(tmp_path), 'test')) > 0


@pytest.mark.slow
def test_corrected_labels_with_a_build_are_read_either_way_said(grapheme_data, tfds_dir,
                                                                tmp_path):
  config = grapheme_configs.get_config('test')
  config.data.update(format='tfds', tfds_dir=tfds_dir, corrected_labels=True)
  with pytest.raises(ValueError) as refused:
    grapheme_task.source(config, str(tmp_path), 'train')
  said = re.findall(r"config\.data\.(\w+)=('?\w+'?)", str(refused.value))
  assert said == [('format', "'kaggle'"), ('corrected_labels', 'False')], said
  for field, value in said:  # each alternative alone
    followed = grapheme_configs.get_config('test')
    followed.data.update(format='tfds', tfds_dir=tfds_dir, dir=grapheme_data,
                         corrected_labels=True)
    followed.data[field] = eval(value)  # pylint: disable=eval-used
    assert len(grapheme_task.source(followed, str(tmp_path / field), 'train')) > 0
