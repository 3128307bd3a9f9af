"""The class map and the synthetic Bengali.AI dataset in the Kaggle layout.

Writing a 32,333-column parquet file costs ~1.5 s whatever its size, so one dataset is written
to disk; the determinism checks capture what a second run would write instead.
"""
import collections
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bengrapheme.grapheme import classes
from bengrapheme.grapheme import kaggle
from bengrapheme.grapheme import synth

NUM_TRAIN, NUM_TEST, SEED = 24, 12, 3
COMPONENTS_ALPHABETICAL = ['consonant_diacritic', 'grapheme_root', 'vowel_diacritic']


def _capture_writes(monkeypatch, write_files):
  """Records every image parquet write as {file name: (ids, images)}; optionally writes it."""
  written = {}
  real_write = kaggle.write_image_parquet

  def write(path, image_ids, images):
    written[os.path.basename(path)] = (list(image_ids), np.array(images))
    if write_files:
      real_write(path, image_ids, images)

  monkeypatch.setattr(kaggle, 'write_image_parquet', write)
  return written


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('synth'))
  with pytest.MonkeyPatch.context() as monkeypatch:
    written = _capture_writes(monkeypatch, write_files=True)
    synth.write_dataset(out, NUM_TRAIN, NUM_TEST, seed=SEED, workers=2)
  return out, written


def _csv_bytes(out):
  names = ['train.csv', 'test.csv', 'sample_submission.csv', 'class_map.csv', 'test_labels.csv']
  return {name: open(os.path.join(out, name), 'rb').read() for name in names}


@pytest.mark.slow
def test_image_files_in_kaggle_layout(dataset):
  out, written = dataset
  for split, num in (('train', NUM_TRAIN), ('test', NUM_TEST)):
    ids = []
    for shard in range(kaggle.NUM_SHARDS):
      parquet = pq.ParquetFile(os.path.join(out, f'{split}_image_data_{shard}.parquet'))
      schema = parquet.schema_arrow
      assert schema.names == ['image_id'] + [str(i) for i in range(32332)]
      assert set(schema.types[1:]) == {pa.uint8()}
      assert parquet.metadata.num_row_groups == 1
      ids += parquet.read(columns=['image_id']).column(0).to_pylist()
    assert ids == [f'{split.capitalize()}_{i}' for i in range(num)]
  # Reading every one of 32,332 columns with pandas takes seconds; every 7th shows the layout.
  columns = [str(i) for i in range(0, 137 * 236, 7)]
  frame = pd.read_parquet(os.path.join(out, 'train_image_data_0.parquet'),
                          columns=['image_id'] + columns)
  assert list(frame.image_id) == [f'Train_{i}' for i in range(NUM_TRAIN // 4)]
  pixels = frame[columns].to_numpy()
  assert pixels.dtype == np.uint8
  expected = written['train_image_data_0.parquet'][1].reshape(NUM_TRAIN // 4, -1)[:, ::7]
  np.testing.assert_array_equal(pixels, expected)
  # Dark ink on light paper, in every image of both splits.
  for _, images in written.values():
    flat = images.reshape(len(images), -1)
    assert np.all(flat.min(axis=1) < 100) and np.all(np.median(flat, axis=1) > 200)


def test_csv_files_in_kaggle_layout(dataset):
  out, _ = dataset
  train = pd.read_csv(os.path.join(out, 'train.csv'))
  assert list(train.columns) == ['image_id', 'grapheme_root', 'vowel_diacritic',
                                 'consonant_diacritic', 'grapheme']
  assert list(train.image_id) == [f'Train_{i}' for i in range(NUM_TRAIN)]
  for row in train.itertuples():
    assert classes.GRAPHEMES[classes.grapheme_id(row.grapheme)] == (
        row.grapheme_root, row.vowel_diacritic, row.consonant_diacritic, row.grapheme)
  test = pd.read_csv(os.path.join(out, 'test.csv'))
  assert list(test.columns) == ['row_id', 'image_id', 'component']
  expected = [(f'Test_{i}_{c}', f'Test_{i}', c)
              for i in range(NUM_TEST) for c in COMPONENTS_ALPHABETICAL]
  assert list(test.itertuples(index=False, name=None)) == expected
  submission = pd.read_csv(os.path.join(out, 'sample_submission.csv'))
  assert list(submission.columns) == ['row_id', 'target']
  assert list(submission.row_id) == list(test.row_id)
  class_map = pd.read_csv(os.path.join(out, 'class_map.csv'), dtype={'component': str})
  assert list(class_map.columns) == ['component_type', 'label', 'component']
  assert list(class_map.itertuples(index=False, name=None)) == classes.class_map()


def test_same_seed_and_any_worker_count_give_the_same_data(dataset, tmp_path, monkeypatch):
  out, written = dataset
  again = _capture_writes(monkeypatch, write_files=False)
  synth.write_dataset(str(tmp_path), NUM_TRAIN, NUM_TEST, seed=SEED, workers=1)
  assert sorted(again) == sorted(written) and len(written) == 2 * kaggle.NUM_SHARDS
  for name in written:
    assert again[name][0] == written[name][0]
    np.testing.assert_array_equal(again[name][1], written[name][1])
  assert _csv_bytes(str(tmp_path)) == _csv_bytes(out)


def test_different_seed_gives_different_data():
  assert synth._plan('train', NUM_TRAIN, 0, 0.3) != synth._plan('train', NUM_TRAIN, 1, 0.3)
  a = synth.render('ক্ট্রো', 'Likhan', [0, 0, 5])
  b = synth.render('ক্ট্রো', 'Likhan', [1, 0, 5])
  assert a.shape == (137, 236) and a.dtype == np.uint8 and not np.array_equal(a, b)


def test_test_split_has_unseen_graphemes_and_held_out_fonts(dataset):
  out, _ = dataset
  labels = pd.read_csv(os.path.join(out, 'test_labels.csv'))
  assert list(labels.columns) == ['image_id', 'grapheme_root', 'vowel_diacritic',
                                  'consonant_diacritic', 'grapheme', 'seen', 'font']
  real = {(r, v, c) for r, v, c, _ in classes.GRAPHEMES}
  unseen = labels[labels.seen == 0]
  assert len(unseen) == round(0.3 * NUM_TEST)
  for row in unseen.itertuples():
    triple = (row.grapheme_root, row.vowel_diacritic, row.consonant_diacritic)
    assert triple not in real and row.grapheme == classes.compose(*triple)
  assert all(classes.grapheme_id(g) >= 0 for g in labels[labels.seen == 1].grapheme)
  assert (labels.font.isin(list(synth.HELD_OUT_FONTS))).sum() == NUM_TEST // 2
  assert not set(synth.HELD_OUT_FONTS) & set(synth.TRAIN_FONTS)
  train_fonts = {row[6] for row in synth._plan('train', NUM_TRAIN, SEED, 0.3)}
  assert train_fonts <= set(synth.TRAIN_FONTS)


def test_train_cycles_through_all_graphemes():
  plan = synth._plan('train', 2 * classes.NUM_GRAPHEMES, 0, 0.3)
  counts = collections.Counter(row[4] for row in plan)
  assert len(counts) == classes.NUM_GRAPHEMES and set(counts.values()) == {2}


def test_fonts_are_picked_only_for_text_they_draw_right():
  # Likhan and Jamrul have no khanda ta, Lohit no no-break space, and Likhan misshapes দ্ব্যু:
  # the checks must see that.
  assert 'ৎ' in synth._missing_chars(synth.FONTS['Likhan'])
  assert not synth._missing_chars(synth.FONTS['Noto Sans Bengali'])
  assert not synth._draws('Lohit Bengali', synth.RENDER_SPELLING['ং'])
  assert not synth._draws('Likhan', 'দ্ব্যু') and synth._draws('Likhan', 'দ্ব্যা')
  for row in synth._plan('test', 300, 0, 0.3) + synth._plan('train', 1295, 0, 0.3):
    assert synth._draws(row[6], row[5])


def test_lone_signs_are_drawn_without_a_dotted_circle():
  for sign in ('ং', 'ঃ'):
    alone = synth._draw_text(sign, 'Noto Sans Bengali')
    drawn = synth._draw_text(synth.RENDER_SPELLING[sign], 'Noto Sans Bengali')
    assert drawn.size[0] < 0.7 * alone.size[0]


def test_class_map():
  rows = classes.class_map()
  counts = collections.Counter(component for component, _, _ in rows)
  assert counts == {'grapheme_root': 168, 'vowel_diacritic': 11, 'consonant_diacritic': 7}
  vowels = [classes.component_string('vowel_diacritic', i) for i in range(11)]
  assert vowels == ['0', 'া', 'ি', 'ী', 'ু', 'ূ', 'ৃ', 'ে', 'ৈ', 'ো', 'ৌ']
  consonants = [classes.component_string('consonant_diacritic', i) for i in range(7)]
  assert consonants == ['0', 'ঁ', 'র্', 'র্য', '্য', '্র', '্র্য']
  assert classes.component_string('grapheme_root', 13) == 'ক'
  with pytest.raises(ValueError, match='vowel_diacritic'):
    classes.component_string('vowel_diacritic', 11)


def test_compose_reproduces_real_spellings():
  wrong = [g for r, v, c, g in classes.GRAPHEMES if classes.compose(r, v, c) != g]
  assert sorted(wrong) == sorted(classes.COMPOSE_EXCEPTIONS)
  assert classes.NUM_GRAPHEMES - len(wrong) == 1291


def test_grapheme_id():
  assert [classes.grapheme_id(g) for _, _, _, g in classes.GRAPHEMES] == list(range(1295))
  assert classes.grapheme_id('ক্ক্ক') == -1


def test_unseen_triples_are_new_and_valid():
  triples = classes.unseen_triples()
  real = {(r, v, c) for r, v, c, _ in classes.GRAPHEMES}
  assert len(triples) > 5000 and not set(triples) & real
  for root, vowel, consonant in triples:
    text = classes.ROOTS[root]
    if text in classes.SIGN_ROOTS:
      pytest.fail(f'sign root {text} takes nothing')
    if text in classes.INDEPENDENT_VOWELS:
      assert (vowel, consonant) == (0, 1)


def test_bad_arguments_are_rejected(tmp_path):
  with pytest.raises(ValueError, match='num_train'):
    synth.write_dataset(str(tmp_path), -1, 1)
  with pytest.raises(ValueError, match='unseen_fraction'):
    synth.write_dataset(str(tmp_path), 1, 1, unseen_fraction=1.5)


def test_bad_grapheme_table_names_the_line_and_field(tmp_path):
  path = tmp_path / 'graphemes.csv'
  path.write_text('grapheme_root,vowel_diacritic,consonant_diacritic,grapheme\n13,11,0,কা\n',
                  encoding='utf-8')
  with pytest.raises(ValueError, match=r'line 2: vowel_diacritic must be an integer in 0\.\.10'):
    classes._read_graphemes(str(path))


def test_never_leaves_a_partial_dataset(tmp_path, monkeypatch):
  (tmp_path / 'full').mkdir()
  (tmp_path / 'full' / 'train.csv').write_text('x')
  with pytest.raises(FileExistsError, match='not empty'):
    synth.write_dataset(str(tmp_path / 'full'), 2, 2, workers=1)

  def crash(*args):
    raise RuntimeError('disk full')

  monkeypatch.setattr(kaggle, 'write_image_parquet', crash)
  with pytest.raises(RuntimeError, match='disk full'):
    synth.write_dataset(str(tmp_path / 'out'), 2, 2, workers=1)
  assert os.listdir(tmp_path) == ['full']  # neither `out` nor its temporary folder


@pytest.mark.slow
@pytest.mark.parametrize('family', ['validation', 'other'])
def test_families_are_kaggle_test_splits_drawn_apart_from_training(family, tmp_path):
  """synth_val (chooses settings) and experiments/grapheme_other_family (reports) write a test split
  the Kaggle reader accepts: half unseen graphemes, only fonts training never uses (and the
  other family none the validation family uses), each image a function of (seed, index)."""
  from bengrapheme.grapheme import synth_val
  if family == 'validation':
    module, fonts = synth_val, synth.HELD_OUT_FONTS
  else:
    from experiments import grapheme_other_family as module
    fonts = module.OTHER_FONTS
    assert not {os.path.realpath(p) for p in fonts.values()} & {
        os.path.realpath(p) for p in synth.FONTS.values()}
  out = tmp_path / family
  module.write_dataset(str(out), 12, seed=SEED, workers=1)
  split = kaggle.validate(str(out), 'test')
  answers = pd.read_csv(out / 'test_labels.csv')
  assert list(split.image_ids) == list(answers.image_id)
  assert answers.seen.sum() == 6
  assert set(answers.font) <= set(fonts)
  assert not set(answers.font) & set(synth.TRAIN_FONTS)
  rows = synth_val.plan(12, SEED, 0.5, fonts, module.SPLIT_CODE)
  image = module.render(rows[3][5], rows[3][6], [SEED, module.SPLIT_CODE, 3])
  stored = pq.read_table(out / kaggle.image_parquet_name('test', 1)).to_pandas()
  assert (stored.iloc[0, 1:].to_numpy(np.uint8).reshape(kaggle.HEIGHT, kaggle.WIDTH)
          == image).all()
  assert image.dtype == np.uint8 and image.min() < 128 < image.max()  # ink on paper


def test_validation_family_stages_can_be_left_out_for_a_diagnosis():
  """Without its stages the family draws the bare glyph on plain paper; each stage changes
  the image; the diagnosis fonts are training's own."""
  from bengrapheme.grapheme import synth_val
  text, font = synth_val.plan(4, SEED, 0.5)[1][5:7]
  seed = [SEED, synth_val.SPLIT_CODE, 1]
  bare = synth_val.render(text, font, seed, stages=())
  assert bare.max() == 245 and bare.min() < 128  # plain paper, dark ink, no noise
  for stage in synth_val.STAGES:
    assert not np.array_equal(synth_val.render(text, font, seed, stages=(stage,)), bare), stage
  assert (synth_val.render(text, font, seed) ==
          synth_val.render(text, font, seed, stages=synth_val.STAGES)).all()
  assert set(synth_val.DIAGNOSIS_FONTS.items()) <= set(synth.TRAIN_FONTS.items())


@pytest.mark.slow
def test_validation_family_train_split_is_an_upper_bound_in_training_fonts(tmp_path):
  """--train writes seen graphemes in the family's look but training's fonts, beside a test
  split equal to the one written without it (the family itself stays the same images)."""
  from bengrapheme.grapheme import synth_val
  alone, both = tmp_path / 'alone', tmp_path / 'both'
  synth_val.write_dataset(str(alone), 6, seed=SEED, workers=1)
  synth_val.write_dataset(str(both), 6, seed=SEED, workers=1, num_train=8)
  train = kaggle.validate(str(both), 'train')
  labels = pd.read_csv(both / 'train.csv')
  assert list(train.image_ids) == list(labels.image_id) == [f'Train_{i}' for i in range(8)]
  assert set(labels.grapheme) <= {g[3] for g in classes.GRAPHEMES}  # seen graphemes only
  rows = synth_val.plan(8, SEED, 0.0, synth.TRAIN_FONTS, synth_val.TRAIN_CODE, 'Train')
  assert {row[6] for row in rows} <= set(synth.TRAIN_FONTS)
  image = synth_val.render(rows[0][5], rows[0][6], [SEED, synth_val.TRAIN_CODE, 0])
  stored = pq.read_table(both / kaggle.image_parquet_name('train', 0)).to_pandas()
  assert (stored.iloc[0, 1:].to_numpy(np.uint8).reshape(kaggle.HEIGHT, kaggle.WIDTH)
          == image).all()
  for name in ['test_labels.csv', *(kaggle.image_parquet_name('test', s) for s in range(4))]:
    assert (alone / name).read_bytes() == (both / name).read_bytes(), name
