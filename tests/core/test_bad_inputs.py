"""The bad-input catalogue: broken data, distance files and flags, across both tasks.

Each case damages a copy of a small good dataset (the session's synthetic Bengali.AI or
HisFrag20 folder), calls the entry point a user reaches it through, and checks that the error
names the file, row or field and what was expected, and that no partial output is left (no
prepared cache, submission, metrics file or new checkpoint). docs/reliability.md's "Bad inputs"
table lists the same cases.

The copies are hard links (the parquet files are 10 MB each), so a damage must replace a
file (`put`, `os.remove`), never write into one; every case checks the originals unchanged.
"""
import io
import json
import os
import pathlib
import re
import shutil
import typing

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from bengrapheme.grapheme import kaggle
from bengrapheme.grapheme import data as grapheme_data_lib, evaluate as grapheme_evaluate
from configs import fragments as fragment_configs
from configs import grapheme as grapheme_configs
from conftest import run_module
from launch import score_distances as score_cli
from retrieval.fragments import distances_io, reader
from retrieval.fragments import data as fragment_data_lib

GRAPHEME_CONFIG = 'configs/grapheme.py:test'


class CLIError(Exception):
  """A CLI run that failed; the message is its error lines (not the traceback)."""


class Case(typing.NamedTuple):
  id: str
  data: str  # 'grapheme' or 'fragments': the session dataset the case damages a copy of
  damage: typing.Callable  # (data, work) -> None
  call: typing.Callable  # (data, work) -> the entry point; must raise `error`
  error: type
  match: str  # regex the error message must match (re.search)
  # (data, work) -> the outputs left that must not be; None: any file under work
  left: typing.Callable = None
  marks: tuple = ()


# ---------------------------------------------------------------- damaging helpers


def put(path, content):
  """Replaces path by a new file (never writes through a hard link to the original)."""
  if os.path.exists(path):
    os.remove(path)
  if isinstance(content, str):
    content = content.encode('utf-8')
  with open(path, 'wb') as f:
    f.write(content)


def edit_lines(path, edit):
  """Replaces a text file by edit(list of its lines)."""
  with open(path, encoding='utf-8') as f:
    lines = f.read().splitlines()
  put(path, '\n'.join(edit(lines)) + '\n')


def set_line(number, text):  # 1-based, as the error messages count
  def edit(lines):
    lines[number - 1] = text
    return lines
  return edit


def kaggle_test(edit):
  """Edits test.csv of a test split laid out as Kaggle ships it: without the answers file
  our synthetic generator adds."""
  def damage(data, work):
    os.remove(data / kaggle.TEST_LABELS)
    edit_lines(data / 'test.csv', edit)
  return damage


def put_parquet(path, table):
  os.remove(path)
  pq.write_table(table, path)


def image_ids(path):
  return pq.read_table(path, columns=['image_id']).column('image_id')


def narrow_shard(path, num_pixels, pixel_type):
  """The shard's image ids with only `num_pixels` pixel columns of `pixel_type`."""
  ids = image_ids(path)
  pixels = [pa.array(np.zeros(len(ids), np.uint8)).cast(pixel_type) for _ in range(num_pixels)]
  put_parquet(path, pa.Table.from_arrays([ids, *pixels],
                                         names=['image_id'] + kaggle.PIXEL_COLUMNS[:num_pixels]))


def null_pixel(path, row, column):
  """Full-width blank images with one pixel missing: the schema checks pass, reading fails."""
  ids = image_ids(path)
  blank = pa.array(np.full(len(ids), 255, np.uint8))
  hole = pa.array([None if r == row else 255 for r in range(len(ids))], pa.uint8())
  columns = [hole if i == column else blank for i in range(kaggle.NUM_PIXELS)]
  put_parquet(path, pa.Table.from_arrays([ids, *columns],
                                         names=['image_id'] + kaggle.PIXEL_COLUMNS))


def jpeg(array):
  out = io.BytesIO()
  Image.fromarray(array).save(out, 'JPEG', quality=90)
  return out.getvalue()


def fragment(data, split, k=0):
  return data / split / sorted(os.listdir(data / split))[k]


def keep_one_fragment_of_first_writer(data):
  first = fragment(data, 'train')
  writer = reader.parse_name(first)[0]
  for name in sorted(os.listdir(data / 'train'))[1:]:
    if reader.parse_name(name)[0] == writer:
      os.remove(data / 'train' / name)


def write_distances(data):
  """A good symmetric distance CSV over the test fragments, in write_distance_csv's header
  layout (line 1 names the columns; the reader also checks the rows against it)."""
  names = sorted(os.listdir(data / 'test'))
  a = np.random.default_rng(0).random((len(names), len(names)))
  d = np.round(a + a.T, 3)
  np.fill_diagonal(d, 0)
  distances_io.write_distance_csv(data / 'distances.csv', d, names, header=True)


def damage_distances(edit):
  """Writes the good distance CSV, then applies edit(lines, names) to its lines."""
  def damage(data, work):
    write_distances(data)
    names = sorted(os.listdir(data / 'test'))
    edit_lines(data / 'distances.csv', lambda lines: edit(lines, names))
  return damage


def set_cell(row, column, value):  # 0-based matrix indices; line 1 is the header
  def edit(lines, names):
    fields = lines[row + 1].split(',')
    fields[column + 1] = value
    lines[row + 1] = ','.join(fields)
    return lines
  return edit


def rename_item(k, new):
  def edit(lines, names):
    header = lines[0].split(',')
    header[k + 1] = new
    lines[0] = ','.join(header)
    lines[k + 1] = new + lines[k + 1][len(names[k]):]
    return lines
  return edit


def swap_row_names(i, j):
  def edit(lines, names):
    lines[i + 1] = names[j] + lines[i + 1][len(names[i]):]
    lines[j + 1] = names[i] + lines[j + 1][len(names[j]):]
    return lines
  return edit


def drop_last_value(row):
  def edit(lines, names):
    lines[row + 1] = lines[row + 1].rsplit(',', 1)[0]
    return lines
  return edit


def no_damage(data, work):
  pass


def read_only_folder(data, work):
  (work / 'ro').mkdir(parents=True)
  (work / 'ro').chmod(0o500)


def file_as_workdir(data, work):
  work.mkdir()
  put(work / 'run', 'notes')


# ---------------------------------------------------------------- entry points


def grapheme_config(data):
  config = grapheme_configs.get_config('test')
  config.data.dir = str(data)
  return config


def fragment_config(data):
  config = fragment_configs.get_config('test')
  config.data.dir = str(data)
  return config


def grapheme_train(data, work):
  """What launch.train reads first: validates and prepares the train split."""
  grapheme_data_lib.source(grapheme_config(data), str(work), 'train')


def grapheme_predict(data, work):
  """launch.predict after the model is loaded; the test split is read before the model is
  touched, so no model is needed to reach the data errors."""
  grapheme_evaluate.predict(grapheme_config(data), None, str(work))


def fragments_source(split):
  def call(data, work):
    fragment_data_lib.source(fragment_config(data), str(work), split)
  return call


def fragments_train(data, work):
  fragment_data_lib.train_data(fragment_config(data), str(work), local_batch=16)


def score_distances(data, work):
  score_cli.run(str(data / 'distances.csv'), str(data / 'test'), str(work / 'metrics.json'))


def error_lines(stderr):
  return '\n'.join(line for line in stderr.splitlines()
                   if re.match(r'[\w.]*(Error|Exception)\b', line))


def train_cli(*args, workdir='run', prefix=(), config=GRAPHEME_CONFIG, env=None):
  def call(data, work):
    result = run_module('launch.train', f'--config={config}', '--data', data,
                        '--workdir', work / workdir, *args, check=False, prefix=prefix,
                        env=env)
    if result.returncode:
      raise CLIError(error_lines(result.stderr))
  return call


# ---------------------------------------------------------------- leftovers


def files_in_work(data, work):
  return [str(p) for p in work.rglob('*') if p.is_file()] if work.exists() else []


def files_in_work_but(*allowed):
  def left(data, work):
    return [p for p in files_in_work(data, work) if os.path.relpath(p, work) not in allowed]
  return left


def files_in_work_but_prepared(data, work):
  """Any file but the prepared data (complete, reused by the next run) and the workdir's
  lock file (released)."""
  return [p for p in files_in_work(data, work) if os.path.relpath(p, work) != 'run/lock' and
          not os.path.relpath(p, work).startswith(os.path.join('run', 'prepared', ''))]


def checkpoint_and_config_kept(data, work):
  """The first run's checkpoint stays the only one, and config.json still describes it."""
  steps = sorted(os.listdir(work / 'run' / 'checkpoints'))
  with open(work / 'run' / 'config.json') as f:
    width = json.load(f)['model']['args']['width']
  return [] if steps == ['1'] and width == 8 else [f'checkpoints {steps}, config width {width}']


# Root ignores permissions through its CAP_DAC_OVERRIDE capability (CI runs as root): the CLI
# runs without it, so that a chmod 500 folder stops root, its owner, as it stops any user.
HELD_TO_PERMISSIONS = (('setpriv', '--bounding-set', '-dac_override', '--')
                       if os.geteuid() == 0 else ())


# ---------------------------------------------------------------- the catalogue

DISTANCES_CSV = r'distances\.csv: '

CASES = [
    # Bengali.AI: train split, as launch.train reads it.
    Case('parquet-file-missing', 'grapheme',
         lambda data, work: os.remove(data / 'train_image_data_2.parquet'), grapheme_train,
         kaggle.DataError, r'train_image_data_2\.parquet: file is missing; the train split '
         r'needs train\.csv and train_image_data_\{0\.\.3\}\.parquet'),
    Case('csv-missing-column', 'grapheme',
         lambda data, work: edit_lines(data / 'train.csv', set_line(
             1, 'image_id,grapheme_root,consonant_diacritic,grapheme')),
         grapheme_train, kaggle.DataError,
         r"train\.csv: header has no column 'vowel_diacritic'; expected columns image_id, "
         r'grapheme_root, vowel_diacritic, consonant_diacritic, grapheme'),
    Case('csv-row-too-short', 'grapheme',
         lambda data, work: edit_lines(data / 'train.csv', set_line(5, 'Train_3,1,2')),
         grapheme_train, kaggle.DataError, r'train\.csv: line 5: 3 fields, expected 5'),
    Case('label-out-of-range', 'grapheme',
         lambda data, work: edit_lines(data / 'train.csv', set_line(3, 'Train_1,168,1,4,x')),
         grapheme_train, kaggle.DataError,
         r"train\.csv: line 3 \(image_id 'Train_1'\): grapheme_root 168 is out of range; "
         r'expected an integer in \[0, 168\)'),
    Case('duplicate-image-id', 'grapheme',
         lambda data, work: edit_lines(data / 'train.csv', lambda lines: lines + [lines[1]]),
         grapheme_train, kaggle.DataError,
         r"train\.csv: line 98: duplicate image_id 'Train_0' \(first at line 2\); expected "
         'each image once'),
    Case('csv-id-not-in-parquet', 'grapheme',
         lambda data, work: edit_lines(data / 'train.csv',
                                       lambda lines: lines + ['Train_999,1,1,1,x']),
         grapheme_train, kaggle.DataError,
         r"train\.csv: image_id 'Train_999' is in none of train_image_data_0\.parquet, "
         r'.*expected pixels for every listed image'),
    Case('parquet-id-not-in-csv', 'grapheme',
         lambda data, work: edit_lines(data / 'train.csv', lambda lines: lines[:-1]),
         grapheme_train, kaggle.DataError,
         r"train_image_data_3\.parquet: row 23: image_id 'Train_95' is not in \S+train\.csv; "
         'expected only listed images'),
    Case('empty-dataset', 'grapheme',
         lambda data, work: edit_lines(data / 'train.csv', lambda lines: lines[:1]),
         grapheme_train, kaggle.DataError,
         r'train\.csv: no data rows; expected at least one image'),
    Case('truncated-parquet', 'grapheme',
         lambda data, work: put(data / 'train_image_data_1.parquet',
                                (data / 'train_image_data_1.parquet').read_bytes()[:5_000_000]),
         grapheme_train, kaggle.DataError,
         r'train_image_data_1\.parquet: cannot be read as parquet'),
    Case('wrong-pixel-count', 'grapheme',
         lambda data, work: narrow_shard(data / 'train_image_data_1.parquet', 100, pa.uint8()),
         grapheme_train, kaggle.DataError,
         r"train_image_data_1\.parquet: 100 pixel columns, expected 32332 named "
         r"'0'\.\.'32331'; missing column '100'"),
    Case('wrong-pixel-dtype', 'grapheme',
         lambda data, work: narrow_shard(data / 'train_image_data_1.parquet', 10, pa.int64()),
         grapheme_train, kaggle.DataError,
         r"train_image_data_1\.parquet: pixel column '0' is int64; expected uint8"),
    Case('missing-pixel-value', 'grapheme',
         lambda data, work: null_pixel(data / 'train_image_data_0.parquet', 23, 9),
         grapheme_train, kaggle.DataError,
         r"train_image_data_0\.parquet: row 23: pixel column '9' is missing; expected uint8"),
    # Bengali.AI: test split, as launch.predict reads it (no submission.csv may appear).
    Case('test-csv-names-missing-image', 'grapheme',
         kaggle_test(lambda lines: lines + [f'Test_999_{c},Test_999,{c}'
                                            for c in sorted(kaggle.COMPONENTS)]),
         grapheme_predict, kaggle.DataError,
         r"test\.csv: image_id 'Test_999' is in none of test_image_data_0\.parquet, .*"
         'expected pixels for every listed image'),
    Case('test-csv-row-id-mismatch', 'grapheme',
         kaggle_test(set_line(2, 'Test_0_root,Test_0,consonant_diacritic')),
         grapheme_predict, kaggle.DataError,
         r"test\.csv: line 2 \(image_id 'Test_0'\): row_id 'Test_0_root' is not "
         r"'Test_0_consonant_diacritic'"),

    # HisFrag20 folders, as training and evaluation read them (no cache may appear).
    Case('zero-byte-jpeg', 'fragments',
         lambda data, work: put(fragment(data, 'test', 3), b''), fragments_source('test'),
         reader.DataError, r'test/10_19_4\.jpg: empty file \(0 bytes\), expected a JPEG'),
    Case('truncated-jpeg', 'fragments',
         lambda data, work: put(fragment(data, 'test', 3),
                                fragment(data, 'test', 3).read_bytes()[:2000]),
         fragments_source('test'), reader.DataError,
         r'test/10_19_4\.jpg: unreadable image \(.+\), expected a JPEG fragment'),
    Case('not-a-jpeg', 'fragments',
         lambda data, work: put(fragment(data, 'train', 3), b'not a jpeg'),
         fragments_source('train'), reader.DataError,
         r'train/1_1_4\.jpg: unreadable image \(.+\), expected a JPEG fragment'),
    Case('all-black-fragment', 'fragments',
         lambda data, work: put(fragment(data, 'train', 0), jpeg(np.zeros((60, 80, 3), np.uint8))),
         fragments_source('train'), reader.DataError,
         r'train/1_1_1\.jpg: all black, expected a fragment with visible content'),
    Case('fragment-name-not-wid-pid-fid', 'fragments',
         lambda data, work: shutil.copy(fragment(data, 'test'), data / 'test' / 'scan_0001.jpg'),
         fragments_source('test'), reader.DataError,
         r'test/scan_0001\.jpg: expected a fragment named WID_PID_FID\.jpg \(integers\)'),
    Case('duplicate-fragment-ids', 'fragments',
         lambda data, work: shutil.copy(fragment(data, 'test'), data / 'test' / '010_19_1.jpg'),
         fragments_source('test'), reader.DataError,
         r'test/10_19_1\.jpg: same writer, page and fragment ids as \S+test/010_19_1\.jpg'),
    Case('empty-split-folder', 'fragments',
         lambda data, work: [os.remove(p) for p in (data / 'test').iterdir()],
         fragments_source('test'), reader.DataError,
         r'test: no fragments \(expected WID_PID_FID\.jpg files\)'),
    Case('single-fragment-writer', 'fragments',
         lambda data, work: keep_one_fragment_of_first_writer(data), fragments_train,
         reader.DataError, r'train/1_1_1\.jpg: writer 1 has only this fragment \(single-fragment '
         r'writers: 1\); training needs at least 2 fragments of every writer'),

    # Distance-matrix CSVs, as launch.score_distances reads them (no --out file may appear).
    Case('distances-not-square', 'fragments', damage_distances(drop_last_value(1)),
         score_distances, ValueError, DISTANCES_CSV + 'line 3 has 37 distances, expected 38'),
    Case('distances-not-symmetric', 'fragments', damage_distances(set_cell(1, 4, '9')),
         score_distances, ValueError,
         DISTANCES_CSV + r'distance matrix is not symmetric: D\[1, 4\] \(10_19_2\.jpg -> '
         r'10_20_1\.jpg\) is 9 but D\[4, 1\] is 1\.247'),
    Case('distances-nan', 'fragments', damage_distances(set_cell(2, 6, 'nan')),
         score_distances, ValueError,
         DISTANCES_CSV + r'distance matrix holds nan at D\[2, 6\] \(10_19_3\.jpg -> '
         r'10_20_3\.jpg\); expected finite distances'),
    Case('distances-not-a-number', 'fragments', damage_distances(set_cell(3, 2, 'abc')),
         score_distances, ValueError, DISTANCES_CSV + "line 5: 'abc' is not a number"),
    Case('distances-unknown-name', 'fragments', damage_distances(rename_item(0, '99_9_9.jpg')),
         score_distances, ValueError,
         DISTANCES_CSV + r"'99_9_9\.jpg' is not a fragment of \S+test \(names not in the "
         r'folder: 1\)'),
    Case('distances-name-repeated', 'fragments', damage_distances(rename_item(2, '10_19_2.jpg')),
         score_distances, ValueError,
         DISTANCES_CSV + r"name '10_19_2\.jpg' is given twice, for rows 2 and 3 \(counting "
         r'from 1\)'),
    Case('distances-rows-out-of-header-order', 'fragments', damage_distances(swap_row_names(0, 1)),
         score_distances, ValueError,
         DISTANCES_CSV + r"line 2 is named '10_19_2\.jpg' but column 1 of the header is "
         r"'10_19_1\.jpg'"),

    # MaskFeat pre-training on a collection too small for its batch of distinct patches.
    Case('maskfeat-batch-larger-than-the-patches', 'fragments', no_damage,
         train_cli('--config.train.batch_size=100000', config='configs/maskfeat.py:test'),
         CLIError, r'train\.batch_size=100000: the training images hold only [\d,]+ patches, '
         r'and a batch takes distinct ones; lower it', left=files_in_work_but_prepared),
    # MaskFeat's demo on a collection: its probe's writers cannot be there; what to pass.
    Case('maskfeat-probe-on-a-collection', 'fragments', no_damage,
         train_cli('--config.data.format=collection', config='configs/maskfeat.py:demo'),
         CLIError, r"config\.evals val: data\.format='collection' has no labels to score; "
         r'train without evaluations \(--config\.evals\.val\.every=0\)',
         left=files_in_work_but_prepared),
    # The rendered graphemes' fonts not installed (`make fonts` skipped).
    Case('rendered-fonts-missing', 'grapheme', no_damage,
         train_cli(env={'BENGRAPHEME_GOOGLE_FONTS': '/nonexistent/google-fonts'}), CLIError,
         r'config\.render\.fraction=[\d.]+: the rendered graphemes need \d+ font\(s\) not '
         r'installed, e\.g\. /nonexistent/google-fonts/.*`make fonts` installs them.*'
         r'--config\.render\.fraction=0', left=files_in_work_but_prepared),
    # SAGHOG's fine-tune before its pre-training: the command that makes the workdir.
    Case('saghog-before-its-pretraining', 'fragments', no_damage,
         train_cli('--config.model.init_from=workdirs/maskfeat-absent',
                   config='configs/fragments.py:recipe=saghog,size=test'),
         CLIError, r"model\.init_from='workdirs/maskfeat-absent': no such workdir\..*"
         r'python -m launch\.train --config configs/maskfeat\.py:test',
         left=files_in_work_but_prepared),
    # Flags and workdirs, through the CLI.
    Case('config-key-mistyped', 'grapheme', no_damage, train_cli('--config.train.stepz=3'),
         CLIError, r"--config\.train\.stepz: config\.train has no field 'stepz' \(did you mean "
         r"'steps'\?\); valid fields: batch_size, checkpoint_every, .*, steps, "),
    Case('config-section-unknown', 'grapheme', no_damage, train_cli('--config.trian.steps=3'),
         CLIError, r"config has no field 'trian' \(did you mean 'train'\?\); valid fields: aug, "
         r'data, eval, evals, input, loss, mesh, model, predict, render, seed, task, train, unseen'),
    Case('config-value-wrong-type', 'grapheme', no_damage, train_cli('--config.train.steps=ten'),
         CLIError, r'flag --config\.train\.steps=ten: invalid literal for int\(\)'),
    Case('workdir-not-writable', 'grapheme',
         read_only_folder, train_cli(workdir='ro/run', prefix=HELD_TO_PERMISSIONS), CLIError,
         r'flag --workdir=\S+/ro/run: \S+/ro is not writable by this user; expected a folder'),
    Case('workdir-is-a-file', 'grapheme',
         file_as_workdir, train_cli(), CLIError,
         r'flag --workdir=\S+/run: \S+/run is a file; expected a folder',
         left=files_in_work_but('run')),
    Case('checkpoint-of-another-model', 'grapheme',
         lambda data, work: train_cli('--config.train.steps=1')(data, work),
         train_cli('--config.model.args.width=16'), CLIError,
         r'Error: \S+/run/checkpoints/1 holds a different model or train state than '
         r'this config builds \(.*shape \(8,\) in the checkpoint, \(16,\) in this config',
         left=checkpoint_and_config_kept,
         marks=(pytest.mark.slow,)),
]

FIXTURES = {'grapheme': 'grapheme_data', 'fragments': 'fragment_data'}


def snapshot(folder):
  return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob('*')}


@pytest.mark.slow
@pytest.mark.parametrize('case', [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input(case, request, tmp_path):
  original = pathlib.Path(request.getfixturevalue(FIXTURES[case.data]))
  before = snapshot(original)
  data, work = tmp_path / 'data', tmp_path / 'work'
  shutil.copytree(original, data, copy_function=os.link)
  case.damage(data, work)
  with pytest.raises(case.error, match=case.match):
    case.call(data, work)
  assert (case.left or files_in_work)(data, work) == []
  assert snapshot(original) == before


def test_catalogue_ids_are_distinct():
  assert len({c.id for c in CASES}) == len(CASES) >= 25


@pytest.mark.slow
def test_undamaged_copies_pass(grapheme_data, fragment_data, tmp_path):
  """The damage, not the copying or the harness, is what each case trips over."""
  for split in ('train', 'test'):
    kaggle.validate(grapheme_data, split)
  data = tmp_path / 'data'
  shutil.copytree(fragment_data, data, copy_function=os.link)
  fragment_data_lib.check_training_writers(str(data / 'train'))
  fragments_source('test')(data, tmp_path / 'work')
  write_distances(data)
  score_distances(data, tmp_path / 'work')
  assert os.path.exists(tmp_path / 'work' / 'metrics.json')
