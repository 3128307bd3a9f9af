"""Reading, validating and preparing the Kaggle Bengali.AI layout, on tiny hand-made data.

Every 32,332-column parquet file costs about a second to write or read, so the data dirs are
built once per module and error cases are symlinked variants that replace one file.
"""
import csv
import io
import os
import pickle
import shutil
import socket
import subprocess
import sys
import types

import grain
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bengrapheme.grapheme import classes
from bengrapheme.grapheme import kaggle
from bengrapheme.grapheme import prepare as prepare_lib
from bengrapheme.grapheme.kaggle import DataError

TRAIN_SHARDS = [[0, 1], [2, 3], [4, 5], [6]]  # image numbers in each train parquet
TRAIN_CSV_ORDER = [3, 0, 6, 1, 5, 2, 4]  # train.csv order differs from parquet order
TEST_SHARDS = [[0], [1, 2], [3], [4]]
TEST_CSV_ORDER = [2, 0, 4, 1, 3]
FAST_WRITE = dict(use_dictionary=False, write_statistics=False)


def csv_text(header, rows):
  out = io.StringIO()
  writer = csv.writer(out, lineterminator='\n')
  writer.writerow(header)
  writer.writerows(rows)
  return out.getvalue()


def write_dir(path, files):
  path.mkdir(parents=True, exist_ok=True)
  for name, content in files.items():
    if isinstance(content, str):
      (path / name).write_text(content, encoding='utf-8')
    else:
      content(path / name)
  return path


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  rng = np.random.default_rng(0)
  d = types.SimpleNamespace()
  d.train_ids = [f'Train_{i}' for i in range(7)]
  d.train_images = rng.integers(0, 256, (7, kaggle.HEIGHT, kaggle.WIDTH), np.uint8)
  d.train_labels = np.stack([rng.integers(0, n, 7) for n in kaggle.NUM_CLASSES], 1)
  with open(classes.GRAPHEMES_CSV, encoding='utf-8') as f:
    table = list(csv.DictReader(f))
  d.train_graphemes = [table[i]['grapheme'] for i in range(6)] + ['not a grapheme']
  d.test_ids = [f'Test_{i}' for i in range(5)]
  d.test_images = rng.integers(0, 256, (5, kaggle.HEIGHT, kaggle.WIDTH), np.uint8)
  d.test_labels = np.stack([rng.integers(0, n, 5) for n in kaggle.NUM_CLASSES], 1)
  d.test_graphemes = [table[10]['grapheme'], 'x', table[11]['grapheme'], 'y', 'z']
  files = {}
  for split, ids, images, shards in (('train', d.train_ids, d.train_images, TRAIN_SHARDS),
                                     ('test', d.test_ids, d.test_images, TEST_SHARDS)):
    for shard, numbers in enumerate(shards):
      files[kaggle.image_parquet_name(split, shard)] = (
          lambda path, numbers=numbers, ids=ids, images=images: kaggle.write_image_parquet(
              path, [ids[i] for i in numbers], images[numbers]))
  files['train.csv'] = csv_text(
      kaggle.LABEL_COLUMNS,
      [[d.train_ids[i], *d.train_labels[i], d.train_graphemes[i]] for i in TRAIN_CSV_ORDER])
  components = sorted(kaggle.COMPONENTS)
  files['test.csv'] = csv_text(
      kaggle.TEST_COLUMNS,
      [[f'{d.test_ids[i]}_{c}', d.test_ids[i], c] for i in TEST_CSV_ORDER for c in components])
  files['test_labels.csv'] = csv_text(
      [*kaggle.LABEL_COLUMNS, 'seen', 'font'],
      [[d.test_ids[i], *d.test_labels[i], d.test_graphemes[i], 1, 'Font'] for i in (4, 3, 2, 1, 0)])
  d.dir = write_dir(tmp_path_factory.mktemp('kaggle'), files)
  d.files = files
  return d


def variant(data, path, **files):
  """A data dir that links to `data`'s files except the ones given (None deletes)."""
  path.mkdir()
  for name in os.listdir(data.dir):
    if name not in files:
      os.symlink(data.dir / name, path / name)
  return write_dir(path, {name: content for name, content in files.items() if content is not None})


def edit_line(text, line, new):
  lines = text.splitlines()
  lines[line - 1] = new
  return '\n'.join(lines) + '\n'


def raises_data_error(fn, *expected):
  with pytest.raises(DataError) as info:
    fn()
  for part in expected:
    assert part in str(info.value), (part, str(info.value))


# --- CSV and cross-file checks --------------------------------------------------------------

TRAIN_HEADER = ','.join(kaggle.LABEL_COLUMNS)


def train_csv_cases(text):
  line2 = text.splitlines()[1].split(',')  # Train_3
  # More train.csv errors are in tests/core/test_bad_inputs.py, the bad-input catalogue.
  return {
      'negative vowel': (edit_line(text, 2, ','.join([line2[0], line2[1], '-1', *line2[3:]])),
                         ['train.csv', 'line 2', 'Train_3', 'vowel_diacritic -1', '[0, 11)']),
      'non-integer': (edit_line(text, 2, ','.join([*line2[:3], '1.5', line2[4]])),
                      ['train.csv', 'line 2', 'consonant_diacritic', "'1.5'", 'integer']),
      'empty label': (edit_line(text, 4, ','.join(['Train_6', '', *line2[2:]])),
                      ['train.csv', 'line 4', 'grapheme_root', "''", 'integer']),
  }


@pytest.mark.slow
@pytest.mark.parametrize('case', ['negative vowel', 'non-integer', 'empty label'])
def test_train_csv_errors(data, tmp_path, case):
  text, expected = train_csv_cases(data.files['train.csv'])[case]
  path = variant(data, tmp_path / 'd', **{'train.csv': text})
  raises_data_error(lambda: kaggle.validate(path, 'train'), *expected)


def test_test_csv_errors(data, tmp_path):
  text = data.files['test.csv']
  lines = text.splitlines()
  cases = {
      'bad component': (edit_line(text, 2, 'Test_2_consonant,Test_2,consonant'),
                        ['test.csv', 'line 2', "'consonant'", 'consonant_diacritic']),
      'two rows': ('\n'.join(lines[:3] + lines[4:]) + '\n',
                   ['test.csv', "'Test_2'", '2 rows', 'three rows']),
      'repeated component': (edit_line(text, 4, 'Test_2_grapheme_root,Test_2,grapheme_root'),
                             ['test.csv', "'Test_2'", 'three rows']),
      'missing column': (text.replace('row_id,image_id,component', 'row_id,image_id,part'),
                         ['test.csv', "'component'"]),
      'empty': (lines[0] + '\n', ['test.csv', 'no data rows']),
  }
  for name, (content, expected) in cases.items():
    path = variant(data, tmp_path / name.replace(' ', '_'), **{'test.csv': content})
    raises_data_error(lambda: kaggle.test_rows(path), *expected)
    raises_data_error(lambda: kaggle.validate(path, 'test'), *expected)


def test_test_labels_errors(data, tmp_path):
  text = data.files['test_labels.csv']
  lines = text.splitlines()
  cases = {
      'missing image': ('\n'.join(lines[:-1]) + '\n',
                        ['test_labels.csv', "'Test_0'", 'test.csv']),
      'extra image': (text + 'Test_9,1,1,1,x,0,F\n', ['test_labels.csv', "'Test_9'", 'test.csv']),
      'out of range': (edit_line(text, 2, 'Test_4,1,11,1,x,0,F'),
                       ['test_labels.csv', 'line 2', 'Test_4', 'vowel_diacritic 11', '[0, 11)']),
      'missing column': (text.replace(',grapheme,', ',glyph,'), ['test_labels.csv', "'grapheme'"]),
  }
  for name, (content, expected) in cases.items():
    path = variant(data, tmp_path / name.replace(' ', '_'), **{'test_labels.csv': content})
    raises_data_error(lambda: kaggle.validate(path, 'test'), *expected)


def test_missing_files(data, tmp_path):
  path = variant(data, tmp_path / 'no_train', **{'train.csv': None})
  raises_data_error(lambda: kaggle.validate(path, 'train'), 'train.csv', 'missing')
  path = variant(data, tmp_path / 'no_test', **{'test.csv': None})
  raises_data_error(lambda: kaggle.test_rows(path), 'test.csv')
  raises_data_error(lambda: prepare_lib.prepare(path, 'test', tmp_path / 'cache'),
                    'test.csv', 'missing')


def test_test_rows_in_file_order(data):
  rows = kaggle.test_rows(data.dir)
  assert [r[0] for r in rows] == [f'{data.test_ids[i]}_{c}' for i in TEST_CSV_ORDER
                                  for c in sorted(kaggle.COMPONENTS)]
  assert rows[0] == ('Test_2_consonant_diacritic', 'Test_2', 'consonant_diacritic')


# --- Parquet schema checks ------------------------------------------------------------------


@pytest.fixture(scope='module')
def wide(data):
  """A two-image wide table to damage, and its pixels."""
  flat = data.train_images[:2].reshape(2, kaggle.NUM_PIXELS)
  columns = [pa.array(['Train_0', 'Train_1'])] + [pa.array(flat[:, i])
                                                  for i in range(kaggle.NUM_PIXELS)]
  return pa.Table.from_arrays(columns, names=['image_id'] + kaggle.PIXEL_COLUMNS), flat


def test_parquet_schema_errors(wide, tmp_path):
  table, _ = wide
  # These checks fire on a few columns; more parquet errors are in tests/core/test_bad_inputs.py.
  head = table.select(['image_id', '0', '1'])
  cases = {
      'misnamed column': (head.rename_columns(['image_id', '0', 'x7']),
                          ["unexpected column 'x7'"]),
      'extra column': (head.append_column('32332', table.column('0')),
                       ["unexpected column '32332'"]),
      'string ids': (head.set_column(0, 'image_id', pa.array([1, 2])), ['"image_id"', 'int64']),
      'no image_id': (head.rename_columns(['id', '0', '1']), ['"image_id"']),
      'duplicate id': (head.set_column(0, 'image_id', pa.array(['Train_0', 'Train_0'])),
                       ['row 1', "duplicate image_id 'Train_0'", 'row 0']),
      'null id': (head.set_column(0, 'image_id', pa.array(['Train_0', None])),
                  ['row 1', 'image_id is missing']),
  }
  for name, (damaged, expected) in cases.items():
    path = tmp_path / f'{name.replace(" ", "_")}.parquet'
    pq.write_table(damaged, path, **FAST_WRITE)
    raises_data_error(lambda: kaggle.ImageParquet(path), str(path), *expected)
  path = tmp_path / 'garbage.parquet'
  path.write_bytes(b'not a parquet file')
  raises_data_error(lambda: kaggle.ImageParquet(path), str(path), 'parquet')


def test_duplicate_across_files(data, tmp_path):
  path = variant(data, tmp_path / 'd')
  os.remove(path / 'train_image_data_3.parquet')
  os.symlink(data.dir / 'train_image_data_0.parquet', path / 'train_image_data_3.parquet')
  raises_data_error(lambda: kaggle.validate(path, 'train'), 'train_image_data_3.parquet',
                    "row 0: duplicate image_id 'Train_0'", 'train_image_data_0.parquet')


def test_pandas_index_columns_tolerated(wide, tmp_path):
  table, flat = wide
  # pandas writes an unnamed index as a last column '__index_level_0__'; a CSV round trip
  # adds a first column 'Unnamed: 0'.
  path = tmp_path / 'indexed.parquet'
  table = table.add_column(0, 'Unnamed: 0', pa.array([0, 1]))
  pq.write_table(table.append_column('__index_level_0__', pa.array([5, 6])), path, **FAST_WRITE)
  image_file = kaggle.ImageParquet(path)
  assert image_file.image_ids == ['Train_0', 'Train_1']
  out = np.zeros((2, kaggle.NUM_PIXELS), np.uint8)
  image_file.read_rows(out, [1, 0])
  np.testing.assert_array_equal(out, flat[::-1])


# --- Files from older and other parquet writers ---------------------------------------------
# The Kaggle files were written by pyarrow 0.10 via pandas. Each variant below is one train
# shard of an 11-image split: each file is read back on its own, and together they are the
# data dir of one `prepare`. Table.from_pandas alone takes ~2.5 s on 32,332 columns, so each
# variant combines several features and is written once per module.

OLD_IDS = [f'Old_{i}' for i in range(11)]
OLD_CSV_ORDER = [5, 9, 0, 3, 7, 10, 1, 8, 2, 6, 4]
# Read with column blocks of 1,500 (2-row groups), 1,024 (3 rows: the floor) or 3,000 columns
# (1 row): block ends, the 1,024-column transposes and row groups all fall out of step.
OLD_BLOCK_BYTES = 3000


def write_pyarrow_010(old, path):
  # A named, non-range index (rows picked from a bigger frame) becomes a last column 'row'.
  table = pa.Table.from_pandas(old.frame.iloc[[7, 2]].rename_axis('row'), preserve_index=True)
  # pyarrow 0.10's defaults: format 1.0, dictionary pages, data page v1, snappy. It stored the
  # pandas metadata but not the Arrow schema ('ARROW:schema' came in 0.15, apache/arrow#5077),
  # so types come from the parquet annotations alone. store_schema=False alone would drop the
  # pandas metadata too (apache/arrow#41766).
  with pq.ParquetWriter(path, table.schema, version='1.0', use_dictionary=True,
                        data_page_version='1.0', compression='snappy',
                        store_schema=False) as writer:
    writer.add_key_value_metadata({'pandas': table.schema.metadata[b'pandas']})
    writer.write_table(table)


def write_pandas_filtered(old, path):
  frame = old.frame.iloc[[1, 4, 6]].copy()  # a filtered frame keeps its index 1, 4, 6
  frame['image_id'] = pd.Categorical(frame['image_id'])
  # As DataFrame.to_parquet: a non-range index is a column '__index_level_0__'; today's
  # defaults (format 2.6, dictionary pages, snappy); row groups of 2 and 1 rows.
  pq.write_table(pa.Table.from_pandas(frame), path, row_group_size=2)


def write_pandas_range(old, path):
  frame = old.frame.iloc[[9, 0]].reset_index(drop=True)
  frame['image_id'] = frame['image_id'].astype(pd.ArrowDtype(pa.large_string()))
  # A RangeIndex is stored as metadata only.
  pq.write_table(pa.Table.from_pandas(frame), path, flavor='spark', use_dictionary=False,
                 data_page_version='2.0', compression='none', write_statistics=False)


def write_pyarrow_plain(old, path):
  numbers = [3, 5, 8, 10]
  flat = old.flat[numbers]
  # A column 'index' first, as df.reset_index() makes it, and no pandas metadata.
  columns = [pa.array(numbers), pa.array([OLD_IDS[i] for i in numbers],
                                         pa.dictionary(pa.int32(), pa.string()))]
  columns += [pa.array(flat[:, i]) for i in range(kaggle.NUM_PIXELS)]
  table = pa.Table.from_arrays(columns, names=['index', 'image_id'] + kaggle.PIXEL_COLUMNS)
  pq.write_table(table, path, version='1.0', data_page_version='2.0', compression='snappy',
                 row_group_size=3, **FAST_WRITE)


# name: (writer, image numbers, what the file holds: image_id type, extra columns, pandas
# index_columns (None: no pandas metadata), stored Arrow schema, format version, row group
# sizes, pixel compression, dictionary-encoded pixels).
OLD_VARIANTS = {
    'pyarrow 0.10 via pandas': (write_pyarrow_010, [7, 2], dict(
        image_id='string', extra=['row'], index_columns=['row'], arrow_schema=False,
        version='1.0', row_groups=[2], compression='SNAPPY', dictionary=True)),
    'pandas filtered categorical': (write_pandas_filtered, [1, 4, 6], dict(
        image_id='dictionary', extra=['__index_level_0__'], index_columns=['__index_level_0__'],
        arrow_schema=True, version='2.6', row_groups=[2, 1], compression='SNAPPY',
        dictionary=True)),
    'pandas range index spark': (write_pandas_range, [9, 0], dict(
        image_id='large_string', extra=[], index_columns=['range'], arrow_schema=True,
        version='2.6', row_groups=[2], compression='UNCOMPRESSED', dictionary=False)),
    'pyarrow dictionary ids v1': (write_pyarrow_plain, [3, 5, 8, 10], dict(
        image_id='dictionary', extra=['index'], index_columns=None, arrow_schema=True,
        version='1.0', row_groups=[3, 1], compression='SNAPPY', dictionary=False)),
}


@pytest.fixture(scope='module')
def old(tmp_path_factory):
  """The older-writer variants' images; `old.path(name)` writes a variant's file once."""
  rng = np.random.default_rng(1)
  d = types.SimpleNamespace()
  d.flat = rng.integers(0, 256, (len(OLD_IDS), kaggle.NUM_PIXELS), np.uint8)
  d.labels = np.stack([rng.integers(0, n, len(OLD_IDS)) for n in kaggle.NUM_CLASSES], 1)
  d.frame = pd.DataFrame(d.flat, columns=kaggle.PIXEL_COLUMNS)
  d.frame.insert(0, 'image_id', OLD_IDS)
  d.train_csv = csv_text(kaggle.LABEL_COLUMNS, [[OLD_IDS[i], *d.labels[i], f'g{i}']
                                                for i in OLD_CSV_ORDER])
  folder = tmp_path_factory.mktemp('old')
  written = {}

  def path(name):
    if name not in written:
      written[name] = folder / f'{name.replace(" ", "_")}.parquet'
      OLD_VARIANTS[name][0](d, written[name])
    return written[name]

  d.path = path
  return d


IMAGE_ID_KINDS = {'string': pa.types.is_string, 'large_string': pa.types.is_large_string,
                  'dictionary': lambda t: pa.types.is_dictionary(t)
                  and pa.types.is_string(t.value_type)}


@pytest.mark.slow
@pytest.mark.parametrize('name', list(OLD_VARIANTS))
def test_older_writer_file_read_back(old, name, monkeypatch):
  _, numbers, expect = OLD_VARIANTS[name]
  image_file = kaggle.ImageParquet(old.path(name))
  # The file is the variant it claims to be.
  meta, schema = image_file._file.metadata, image_file._file.schema_arrow
  assert IMAGE_ID_KINDS[expect['image_id']](schema.field('image_id').type)
  known = {'image_id', *kaggle.PIXEL_COLUMNS}
  assert [n for n in schema.names if n not in known] == expect['extra']
  pandas_index = schema.pandas_metadata and [c if isinstance(c, str) else c['kind']
                                             for c in schema.pandas_metadata['index_columns']]
  assert pandas_index == expect['index_columns']
  assert (b'ARROW:schema' in (meta.metadata or {})) == expect['arrow_schema']
  assert meta.format_version == expect['version']
  assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == expect['row_groups']
  pixel = schema.get_field_index('0')
  chunk = meta.row_group(0).column(pixel)
  assert chunk.compression == expect['compression']
  assert any('DICTIONARY' in e for e in chunk.encodings) == expect['dictionary']
  # Pixels as pandas writes uint8: parquet INT32 annotated UINT_8, read back as uint8.
  column = meta.schema.column(pixel)
  assert (column.physical_type, column.converted_type) == ('INT32', 'UINT_8')
  assert set(schema.types[pixel:pixel + kaggle.NUM_PIXELS]) == {pa.uint8()}

  assert image_file.image_ids == [OLD_IDS[i] for i in numbers]
  assert {type(i) for i in image_file.image_ids} == {str}
  monkeypatch.setattr(kaggle, 'BLOCK_BYTES', OLD_BLOCK_BYTES)
  out = np.zeros((len(numbers) + 1, kaggle.NUM_PIXELS), np.uint8)
  rows = np.arange(len(numbers), 0, -1)  # reversed, and out[0] is left alone
  image_file.read_rows(out, rows)
  np.testing.assert_array_equal(out[rows], old.flat[numbers])
  assert not out[0].any()


@pytest.mark.slow
def test_older_writer_files_prepare_round_trip(old, tmp_path):
  root = tmp_path / 'data'
  root.mkdir()
  for shard, name in enumerate(OLD_VARIANTS):
    os.symlink(old.path(name), root / kaggle.image_parquet_name('train', shard))
  (root / 'train.csv').write_text(old.train_csv, encoding='utf-8')
  # Default column blocks here: one block per row group.
  source = prepare_lib.GraphemeSource(prepare_lib.prepare(root, 'train', tmp_path / 'cache'))
  assert source.image_ids == [OLD_IDS[i] for i in OLD_CSV_ORDER]
  assert source.graphemes == [f'g{i}' for i in OLD_CSV_ORDER]
  np.testing.assert_array_equal(source.labels, old.labels[OLD_CSV_ORDER])
  for k, i in enumerate(OLD_CSV_ORDER):
    np.testing.assert_array_equal(source[k]['image'],
                                  old.flat[i].reshape(kaggle.HEIGHT, kaggle.WIDTH))


@pytest.mark.parametrize('kind', ['dictionary', 'pandas categorical', 'large_string'])
def test_missing_image_id_in_other_string_types(tmp_path, kind):
  ids = ['Train_0', 'Train_1', None, 'Train_3']
  pixels = [pa.array(np.arange(4, dtype=np.uint8))] * 2
  if kind == 'pandas categorical':
    frame = pd.DataFrame({'image_id': pd.Categorical(ids), '0': np.arange(4, dtype=np.uint8),
                          '1': np.arange(4, dtype=np.uint8)})
    table = pa.Table.from_pandas(frame)
  else:
    type_ = pa.dictionary(pa.int32(), pa.string()) if kind == 'dictionary' else pa.large_string()
    table = pa.Table.from_arrays([pa.array(ids, type_), *pixels], names=['image_id', '0', '1'])
  path = tmp_path / 'ids.parquet'
  pq.write_table(table, path, row_group_size=2, **FAST_WRITE)  # the null opens row group 1
  raises_data_error(lambda: kaggle.ImageParquet(path), str(path), 'row 2: image_id is missing')


def test_pandas_int64_pixels_rejected(tmp_path):
  # A frame built without dtype=np.uint8 holds int64: 8x the size, not what Kaggle ships.
  frame = pd.DataFrame({'image_id': ['Train_0', 'Train_1'], '0': [0, 255], '1': [7, 8]})
  path = tmp_path / 'int64.parquet'
  pq.write_table(pa.Table.from_pandas(frame), path, **FAST_WRITE)
  raises_data_error(lambda: kaggle.ImageParquet(path), str(path),
                    "pixel column '0' is int64; expected uint8")


# --- prepare and GraphemeSource -------------------------------------------------------------


@pytest.fixture(scope='module')
def read_only(data, tmp_path_factory):
  """A read-only copy of the data dir with its train split prepared (the download may be
  read-only)."""
  root = tmp_path_factory.mktemp('ro') / 'data'
  shutil.copytree(data.dir, root)
  for path in [root, *root.iterdir()]:
    path.chmod(path.stat().st_mode & ~0o222)
  cache = tmp_path_factory.mktemp('cache')
  before = snapshot(root)
  yield types.SimpleNamespace(dir=root, cache=cache, before=before,
                              train=prepare_lib.prepare(root, 'train', cache))
  root.chmod(0o755)


def snapshot(path):
  return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in [path, *path.iterdir()]}


def test_read_only_data_dir_untouched(read_only):
  # As root, chmod does not stop writes: check that nothing was written either.
  assert snapshot(read_only.dir) == read_only.before
  assert not os.access(read_only.dir, os.W_OK) or os.geteuid() == 0


def test_prepare_round_trip_train(data, read_only):
  source = prepare_lib.GraphemeSource(read_only.train)
  order = TRAIN_CSV_ORDER
  assert len(source) == 7 and source.image_ids == [data.train_ids[i] for i in order]
  for k, i in enumerate(order):
    item = source[k]
    assert item['image'].dtype == np.uint8 and item['image'].shape == (137, 236)
    np.testing.assert_array_equal(item['image'], data.train_images[i])
    assert item['labels'].dtype == np.int32
    np.testing.assert_array_equal(item['labels'], data.train_labels[i])
    assert item['grapheme'].dtype == np.int32 and item['index'].dtype == np.int32
    assert item['grapheme'] == classes.grapheme_id(data.train_graphemes[i])
    assert item['index'] == k
  assert source[2]['grapheme'] == -1  # 'not a grapheme'
  assert source[1]['grapheme'] == 0  # first row of graphemes.csv
  with pytest.raises(IndexError):
    source[7]


def test_cache_reused_when_unchanged(read_only):
  before = {p.name: p.stat().st_mtime_ns for p in read_only.train.iterdir()}
  assert prepare_lib.prepare(read_only.dir, 'train', read_only.cache) == read_only.train
  assert {p.name: p.stat().st_mtime_ns for p in read_only.train.iterdir()} == before
  assert [p.name for p in read_only.cache.iterdir()] == [read_only.train.name]


def test_test_without_labels(data, tmp_path):
  path = variant(data, tmp_path / 'd', **{'test_labels.csv': None})
  split = kaggle.validate(path, 'test')
  assert split.image_ids == [data.test_ids[i] for i in TEST_CSV_ORDER]
  assert (split.labels == -1).all() and split.labels.shape == (5, 3)
  assert split.graphemes == [''] * 5


@pytest.mark.slow
def test_prepare_test_split_failure_and_rebuild(data, tmp_path, monkeypatch):
  path = variant(data, tmp_path / 'd', **{'test_labels.csv': data.files['test_labels.csv']})
  cache = tmp_path / 'cache'
  first = prepare_lib.prepare(path, 'test', cache)
  source = prepare_lib.GraphemeSource(first)
  assert source.image_ids == [data.test_ids[i] for i in TEST_CSV_ORDER]  # test.csv order
  for k, i in enumerate(TEST_CSV_ORDER):
    np.testing.assert_array_equal(source[k]['image'], data.test_images[i])
    np.testing.assert_array_equal(source[k]['labels'], data.test_labels[i])
    assert source[k]['grapheme'] == classes.grapheme_id(data.test_graphemes[i])

  # A changed source file (new labels, new mtime) needs a fresh conversion.
  text = edit_line(data.files['test_labels.csv'], 2, 'Test_4,5,5,5,x,0,F')
  (path / 'test_labels.csv').write_text(text, encoding='utf-8')
  os.utime(path / 'test_labels.csv', ns=(1, 1))

  # A build that fails midway leaves nothing a later call could take for a cache, and the
  # previous conversion untouched.
  read_rows = kaggle.ImageParquet.read_rows
  calls = []

  def fail_on_second_file(self, out, rows):
    calls.append(self.path)
    if len(calls) == 2:
      raise OSError('disk full')
    read_rows(self, out, rows)

  monkeypatch.setattr(kaggle.ImageParquet, 'read_rows', fail_on_second_file)
  with pytest.raises(OSError, match='disk full'):
    prepare_lib.prepare(path, 'test', cache)
  monkeypatch.undo()
  assert [p.name for p in cache.iterdir()] == [first.name]

  # A build killed outright leaves its temporary dir: it is never reused, and is removed.
  dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                        capture_output=True, text=True, check=True).stdout.strip()
  stale = cache / f'.tmp-{first.name}-{dead}@{socket.gethostname()}'
  shutil.copytree(first, stale)

  second = prepare_lib.prepare(path, 'test', cache)
  assert [p.name for p in cache.iterdir()] == [second.name] and second != first
  source = prepare_lib.GraphemeSource(second)
  np.testing.assert_array_equal(source[source.image_ids.index('Test_4')]['labels'], [5, 5, 5])
  np.testing.assert_array_equal(source[0]['image'], data.test_images[TEST_CSV_ORDER[0]])


def test_grain_threads_and_pickle(data, read_only):
  source = prepare_lib.GraphemeSource(read_only.train)
  source[0]  # opens the memory map, which must not travel through pickle
  blob = pickle.dumps(source)
  assert len(blob) < kaggle.NUM_PIXELS  # no pixels inside
  source = pickle.loads(blob)
  dataset = (grain.MapDataset.source(source).shuffle(seed=1).batch(3)
             .to_iter_dataset(grain.ReadOptions(num_threads=4, prefetch_buffer_size=4)))
  batches = list(dataset)
  assert [len(b['index']) for b in batches] == [3, 3, 1]
  index = np.concatenate([b['index'] for b in batches])
  assert sorted(index) == list(range(7))
  images = np.concatenate([b['image'] for b in batches])
  expected = data.train_images[np.array(TRAIN_CSV_ORDER)[index]]
  np.testing.assert_array_equal(images, expected)
  assert batches[0]['labels'].dtype == np.int32 and batches[0]['labels'].shape == (3, 3)
