"""The Bengali.AI (Kaggle bengaliai-cv19) file layout: constants, writer, reader, validation.

Images are stored "wide": one parquet row per image, column `image_id` plus 32,332 uint8
pixel columns named '0'..'32331' (row-major 137x236, 0 = black ink, 255 = white paper).

The reader takes a data dir exactly as Kaggle ships it (it may be read-only) and checks it
before anything is converted: every problem raises `DataError` naming the file, the row or
field, and what was expected, so a broken download fails at once instead of mid-training.
"""
import csv
import dataclasses
import os
import pathlib
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# The label columns and their class counts (the core's metrics define them for the score).
from bengrapheme import errors
from bengrapheme.grapheme.metrics import COMPONENTS, NUM_CLASSES

HEIGHT, WIDTH = 137, 236
NUM_PIXELS = HEIGHT * WIDTH
PIXEL_COLUMNS = [str(i) for i in range(NUM_PIXELS)]
_PIXEL_SET = frozenset(PIXEL_COLUMNS)
NUM_SHARDS = 4  # train_image_data_{0..3}.parquet, test_image_data_{0..3}.parquet
SPLITS = ('train', 'test')
TEST_LABELS = 'test_labels.csv'  # answers written by our synthetic generator; Kaggle has none
LABEL_COLUMNS = ('image_id',) + COMPONENTS + ('grapheme',)
# The March 2020 label update: train rows relabelled with consonant class 7 (reph + ra-phala),
# and the class map that adds that class.
MULTI_DIACRITICS = 'train_multi_diacritics.csv'
CLASS_MAP_CORRECTED = 'class_map_corrected.csv'
CLASS_MAP_COLUMNS = ('component_type', 'label', 'component')
CORRECTED_NUM_CLASSES = NUM_CLASSES[:2] + (NUM_CLASSES[2] + 1,)
TEST_COLUMNS = ('row_id', 'image_id', 'component')
# Pixel columns are converted in blocks of about this many bytes (at least 1,024 columns):
# small enough that memory holds only a block of the file, large enough that the reader's
# per-call setup (~15 ms) does not dominate small files.
BLOCK_BYTES = 32 << 20


class DataError(errors.UserError, ValueError):
  """The data dir does not match the Kaggle layout; the message says which file and where."""


def image_parquet_name(split, shard):
  return f'{split}_image_data_{shard}.parquet'


def write_image_parquet(path, image_ids, images):
  """Writes images [N, 137, 236] uint8 in the Kaggle wide layout, one row group."""
  images = np.asarray(images)
  if images.dtype != np.uint8 or images.shape[1:] != (HEIGHT, WIDTH):
    raise ValueError(f'{path}: expected uint8 images [N, {HEIGHT}, {WIDTH}], got '
                     f'{images.dtype} {images.shape}')
  flat = images.reshape(len(images), NUM_PIXELS)
  columns = [pa.array(list(image_ids), pa.string())]
  columns += [pa.array(flat[:, i]) for i in range(NUM_PIXELS)]
  table = pa.Table.from_arrays(columns, names=['image_id'] + PIXEL_COLUMNS)
  pq.write_table(table, path, row_group_size=max(len(images), 1))


@dataclasses.dataclass
class Split:
  """A validated split: images in their canonical order, and where each one is stored.

  Train order is train.csv order; test order is the order in which image ids first appear
  in test.csv. `shards` are the split's image files, open.
  """
  image_ids: list
  labels: np.ndarray  # int32 [N, 3] in COMPONENTS order, -1 where unknown
  graphemes: list  # grapheme strings, '' where unknown
  shards: list  # ImageParquet


def source_files(data_dir, split):
  """The files a split is read from, in a fixed order (CSV files first)."""
  _check_split(split)
  data_dir = pathlib.Path(data_dir)
  names = [f'{split}.csv'] + [image_parquet_name(split, s) for s in range(NUM_SHARDS)]
  if split == 'test' and (data_dir / TEST_LABELS).exists():
    names.append(TEST_LABELS)
  paths = [data_dir / name for name in names]
  for path in paths:
    if not path.is_file():
      raise DataError(f'{path}: file is missing; the {split} split needs '
                      f'{split}.csv and {image_parquet_name(split, "{0..3}")} in {data_dir}')
  return paths


def validate(data_dir, split):
  """Checks a split's CSV and parquet files against each other; returns a `Split`.

  Reads only the image ids from the parquet files, not the pixels (whose dtype the schema
  check covers), so it is quick even on the 6.5 GB train set.
  """
  paths = source_files(data_dir, split)
  csv_path, parquet_paths = paths[0], paths[1:1 + NUM_SHARDS]
  if split == 'train':
    image_ids, labels, graphemes = _read_label_csv(csv_path)
  else:
    image_ids = list(dict.fromkeys(image_id for _, image_id, _ in test_rows(data_dir)))
    labels = np.full((len(image_ids), len(COMPONENTS)), -1, np.int32)
    graphemes = [''] * len(image_ids)
    if len(paths) > 1 + NUM_SHARDS:
      labels, graphemes = _test_labels(paths[-1], csv_path, image_ids)
  shards = [ImageParquet(path) for path in parquet_paths]
  _check_same_ids(csv_path, image_ids, shards)
  return Split(image_ids, labels, graphemes, shards)


def corrected_labels(data_dir, image_ids):
  """The train labels after the March 2020 update: {row: int32 [3]} for the rows of
  `image_ids` (train.csv order) that train_multi_diacritics.csv relabels, their consonant
  diacritic in the 8 classes of class_map_corrected.csv. Both files must be in data_dir."""
  data_dir = pathlib.Path(data_dir)
  for name in (MULTI_DIACRITICS, CLASS_MAP_CORRECTED):
    if not (data_dir / name).is_file():
      raise DataError(f'{data_dir / name}: file is missing; config.data.corrected_labels '
                      f'needs {MULTI_DIACRITICS} and {CLASS_MAP_CORRECTED} (Kaggle added them '
                      'in March 2020), or set config.data.corrected_labels=False')
  _check_corrected_class_map(data_dir / CLASS_MAP_CORRECTED)
  path = data_dir / MULTI_DIACRITICS
  ids, labels, _ = _read_label_csv(path, CORRECTED_NUM_CLASSES, allow_empty=True)
  row = {image_id: i for i, image_id in enumerate(image_ids)}
  missing = [image_id for image_id in ids if image_id not in row]
  if missing:
    raise DataError(f'{path}: image_id {missing[0]!r} is not in train.csv ({len(missing)} such '
                    'rows); expected corrections of train images only')
  return {row[image_id]: label for image_id, label in zip(ids, labels)}


def _check_corrected_class_map(path):
  """class_map_corrected.csv lists every class of the three components once, consonant
  diacritic with 8 classes."""
  found = {name: set() for name in COMPONENTS}
  for line, row in _read_csv(path, CLASS_MAP_COLUMNS):
    kind, label = row['component_type'], row['label'].strip()
    if kind not in found:
      raise DataError(f'{path}: line {line}: component_type {kind!r} is not one of '
                      f'{", ".join(COMPONENTS)}')
    if not label.isdigit():
      raise DataError(f'{path}: line {line}: label {label!r} is not an integer')
    found[kind].add(int(label))
  for kind, n in zip(COMPONENTS, CORRECTED_NUM_CLASSES):
    if found[kind] != set(range(n)):
      raise DataError(f'{path}: {kind} has labels {sorted(found[kind])}; expected 0..{n - 1}')


def test_rows(data_dir):
  """test.csv as a list of (row_id, image_id, component) in file order, validated."""
  path = pathlib.Path(data_dir) / 'test.csv'
  rows = []
  components = {}
  for line, row in _read_csv(path, TEST_COLUMNS):
    row_id, image_id, component = row['row_id'], row['image_id'], row['component']
    where = f'{path}: line {line} (image_id {image_id!r})'
    if component not in COMPONENTS:
      raise DataError(f'{where}: component {component!r} is not one of '
                      f'{", ".join(sorted(COMPONENTS))}')
    if row_id != f'{image_id}_{component}':
      raise DataError(f'{where}: row_id {row_id!r} is not '
                      f'{image_id + "_" + component!r} (image_id_component)')
    components.setdefault(image_id, []).append(component)
    rows.append((row_id, image_id, component))
  for image_id, found in components.items():
    if sorted(found) != sorted(COMPONENTS):
      raise DataError(f'{path}: image_id {image_id!r} has {len(found)} rows with components '
                      f'{found}; expected three rows, one for each of {list(COMPONENTS)}')
  return rows


class ImageParquet:
  """One wide image parquet file: its schema and image ids are checked on opening.

  Kept open from validation to conversion, since parsing the footer of 32,333 columns is
  the main cost of opening.
  """

  def __init__(self, path):
    self.path = path
    try:
      self._file = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
      raise DataError(f'{path}: cannot be read as parquet: {e}') from e
    schema = self._file.schema_arrow
    if schema.names.count('image_id') != 1:
      raise DataError(f'{path}: {schema.names.count("image_id")} columns "image_id"; expected '
                      f"one, plus pixel columns '0'..'{NUM_PIXELS - 1}'")
    image_id_type = schema.field('image_id').type
    # pandas writes a Categorical column as dictionary<string>: its values are the ids.
    value_type = (image_id_type.value_type if pa.types.is_dictionary(image_id_type)
                  else image_id_type)
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
            or pa.types.is_string_view(value_type)):
      raise DataError(f'{path}: column "image_id" is {image_id_type}; expected strings')
    image_ids = self._file.read(columns=['image_id']).column('image_id')
    if pa.types.is_dictionary(image_ids.type):
      # Decoded, a null is a null whether its index or its dictionary value is missing.
      image_ids = image_ids.cast(image_ids.type.value_type)
    if image_ids.null_count:
      row = image_ids.is_null().to_pylist().index(True)
      raise DataError(f'{path}: row {row}: image_id is missing')
    self.image_ids = image_ids.to_pylist()
    _check_unique(path, self.image_ids, 'row', lambda i: i)
    names = schema.names
    index_columns = _index_columns(schema, [n for n in names if n not in _PIXEL_SET])
    _check_pixel_columns(path, schema,
                         [n for n in names if n != 'image_id' and n not in index_columns])

  def read_rows(self, out, rows, begin=0, end=None):
    """Reads the pixels of the file's images begin..end-1 (default: all) into out: the k-th
    of them into out[rows[k]].

    out: a [M, 32332] uint8 array (an np.memmap works, so a whole split never has to fit in
    memory). Columns are decoded a block at a time into a column-major buffer (contiguous
    copies) and transposed into the rows: writing one column at a time into row-major memory
    would miss the cache on every byte. Decoding the parquet pages is most of the time, and a
    page holds a column of a whole row group: reading part of a one-row-group file (as the
    real ones are) decodes all of it.
    """
    rows = np.asarray(rows, np.intp)
    end = len(self.image_ids) if end is None else end
    start = 0
    for group in range(self._file.num_row_groups):
      num_rows = self._file.metadata.row_group(group).num_rows
      lo, hi = max(begin, start), min(end, start + num_rows)
      if lo < hi:
        self._read_group(out, rows[lo - begin:hi - begin], group, num_rows, lo - start,
                         hi - start, start)
      start += num_rows

  def _read_group(self, out, dest, group, num_rows, lo, hi, first_row):
    """Rows lo..hi-1 of row group `group` (file rows from first_row) into out[dest]."""
    step = min(NUM_PIXELS, max(1024, BLOCK_BYTES // num_rows))
    for begin in range(0, NUM_PIXELS, step):
      names = PIXEL_COLUMNS[begin:begin + step]
      # Decoding threads cost more than they save on a few rows.
      table = self._file.read_row_group(group, columns=names, use_threads=num_rows >= 1024)
      block = np.empty((len(names), hi - lo), np.uint8)
      for j, column in enumerate(table.columns):
        column = column.slice(lo, hi - lo)
        if column.null_count:
          row = first_row + lo + column.is_null().to_pylist().index(True)
          raise DataError(f'{self.path}: row {row}: pixel column {names[j]!r} is missing; '
                          'expected uint8 values')
        block[j] = column.to_numpy()
      del table
      # Transposing 1,024 columns at a time keeps both sides in cache: ~4x faster than
      # the whole block at once.
      for sub in range(0, len(names), 1024):
        stop = min(sub + 1024, len(names))
        out[dest, begin + sub:begin + stop] = block[sub:stop].T


def _check_split(split):
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')


def _index_columns(schema, candidates):
  """Which candidate columns are extra pandas index columns, as some copies of the data carry."""
  names = set()
  if schema.pandas_metadata:
    # RangeIndex entries are dicts (stored as metadata only, not as a column).
    names.update(c for c in schema.pandas_metadata.get('index_columns', []) if isinstance(c, str))
  for name in candidates:
    unnamed = (name in ('', 'index') or name.startswith('Unnamed')
               or re.fullmatch(r'__index_level_\d+__', name))
    if unnamed and pa.types.is_integer(schema.field(name).type):
      names.add(name)
  return names


def _check_pixel_columns(path, schema, pixel_names):
  unexpected = [name for name in pixel_names if name not in _PIXEL_SET]
  if unexpected:
    raise DataError(f'{path}: unexpected column {unexpected[0]!r} ({len(unexpected)} in all); '
                    f"expected image_id plus pixel columns '0'..'{NUM_PIXELS - 1}'")
  for name, type_ in zip(schema.names, schema.types):
    if name in _PIXEL_SET and type_ != pa.uint8():
      raise DataError(f'{path}: pixel column {name!r} is {type_}; expected uint8')
  present = set(pixel_names)
  if len(present) != len(pixel_names):
    seen = set()
    duplicate = next(name for name in pixel_names if name in seen or seen.add(name))
    raise DataError(f'{path}: pixel column {duplicate!r} appears more than once')
  if len(pixel_names) != NUM_PIXELS:
    missing = next(name for name in PIXEL_COLUMNS if name not in present)
    raise DataError(f'{path}: {len(pixel_names)} pixel columns, expected {NUM_PIXELS} '
                    f"named '0'..'{NUM_PIXELS - 1}'; missing column {missing!r}")


def _read_csv(path, required, allow_empty=False):
  """Yields (line number, row dict) for each data row; checks the header and field count."""
  try:
    f = open(path, newline='', encoding='utf-8-sig')
  except FileNotFoundError as e:
    raise DataError(f'{path}: file is missing; expected columns {", ".join(required)}') from e
  except OSError as e:
    raise DataError(f'{path}: cannot be read: {e}') from e
  try:
    with f:
      reader = csv.reader(f)
      header = next(reader, None)
      if header is None:
        raise DataError(f'{path}: file is empty; expected a header with {", ".join(required)}')
      missing = [name for name in required if name not in header]
      if missing:
        raise DataError(f'{path}: header has no column {missing[0]!r}; expected columns '
                        f'{", ".join(required)} (found {", ".join(header)})')
      count = 0
      for row in reader:
        if not row:
          continue
        if len(row) != len(header):
          raise DataError(f'{path}: line {reader.line_num}: {len(row)} fields, expected '
                          f'{len(header)} ({", ".join(header)})')
        count += 1
        yield reader.line_num, dict(zip(header, row))
  except UnicodeDecodeError as e:
    raise DataError(f'{path}: not UTF-8 text: {e}') from e
  if not count and not allow_empty:
    raise DataError(f'{path}: no data rows; expected at least one image')


def _read_label_csv(path, num_classes=NUM_CLASSES, allow_empty=False):
  """Reads image_id, the three labels and grapheme from train.csv, test_labels.csv or
  train_multi_diacritics.csv."""
  image_ids, labels, graphemes, lines = [], [], [], []
  for line, row in _read_csv(path, LABEL_COLUMNS, allow_empty):
    image_id = row['image_id']
    if not image_id:
      raise DataError(f'{path}: line {line}: image_id is empty')
    labels.append([_parse_label(path, line, image_id, row, i, num_classes[i])
                   for i in range(len(COMPONENTS))])
    image_ids.append(image_id)
    graphemes.append(row['grapheme'])
    lines.append(line)
  _check_unique(path, image_ids, 'line', lambda i: lines[i])
  return image_ids, np.array(labels, np.int32).reshape(-1, len(COMPONENTS)), graphemes


def _parse_label(path, line, image_id, row, i, num_classes):
  name, value = COMPONENTS[i], row[COMPONENTS[i]]
  expected = f'expected an integer in [0, {num_classes})'
  if not re.fullmatch(r'-?[0-9]+', value.strip()):
    raise DataError(f'{path}: line {line} (image_id {image_id!r}): {name} {value!r} is not '
                    f'an integer; {expected}')
  label = int(value)
  if not 0 <= label < num_classes:
    raise DataError(f'{path}: line {line} (image_id {image_id!r}): {name} {label} is out of '
                    f'range; {expected}')
  return label


def _test_labels(path, test_csv, image_ids):
  """Labels and graphemes from test_labels.csv, in the order of image_ids."""
  label_ids, labels, graphemes = _read_label_csv(path)
  position = {image_id: i for i, image_id in enumerate(label_ids)}
  missing = [image_id for image_id in image_ids if image_id not in position]
  if missing:
    raise DataError(f'{path}: no labels for image_id {missing[0]!r} of {test_csv} '
                    f'({len(missing)} such images); expected one row per test image')
  if len(label_ids) != len(image_ids):
    known = set(image_ids)
    extra = next(image_id for image_id in label_ids if image_id not in known)
    raise DataError(f'{path}: image_id {extra!r} is not in {test_csv}; expected labels only '
                    'for test images')
  order = [position[image_id] for image_id in image_ids]
  return labels[order], [graphemes[i] for i in order]


def _check_unique(path, image_ids, unit, where):
  first = {}
  for i, image_id in enumerate(image_ids):
    if image_id in first:
      raise DataError(f'{path}: {unit} {where(i)}: duplicate image_id {image_id!r} (first at '
                      f'{unit} {where(first[image_id])}); expected each image once')
    first[image_id] = i


def _check_same_ids(csv_path, image_ids, shards):
  """The CSV and the parquet files must hold the same images, each exactly once."""
  stored = {}
  for shard in shards:
    for row, image_id in enumerate(shard.image_ids):
      if image_id in stored:
        raise DataError(f'{shard.path}: row {row}: duplicate image_id {image_id!r}, also in '
                        f'{stored[image_id]}; expected each image once')
      stored[image_id] = shard.path
  missing = [image_id for image_id in image_ids if image_id not in stored]
  if missing:
    names = ', '.join(os.path.basename(shard.path) for shard in shards)
    raise DataError(f'{csv_path}: image_id {missing[0]!r} is in none of {names} '
                    f'({len(missing)} such images); expected pixels for every listed image')
  if len(stored) != len(image_ids):
    known = set(image_ids)
    for shard in shards:
      for row, image_id in enumerate(shard.image_ids):
        if image_id not in known:
          raise DataError(f'{shard.path}: row {row}: image_id {image_id!r} is not in '
                          f'{csv_path}; expected only listed images')
