"""The HisFrag20 folder reader, its grain source, and the synthetic dataset's layout."""
import concurrent.futures
import os
import pickle
import re

import grain
import numpy as np
from PIL import Image
import pytest

from retrieval.fragments import reader
from retrieval.synthetic import synth


def _fragment(h, w, seed=0):
  """A paper-coloured fragment [h, w, 3] with a black corner outside its 'tear'."""
  rng = np.random.default_rng(seed)
  image = (np.array([200, 180, 140]) + rng.integers(0, 30, (h, w, 3))).astype(np.uint8)
  image[:h // 4, :w // 4] = 0
  return image


def _save(folder, name, image):
  path = os.path.join(folder, name)
  Image.fromarray(image).save(path, quality=90)
  return path


@pytest.fixture
def folder(tmp_path):
  """Writers 10 and 2 (numeric order differs from text order), three pages, five fragments."""
  for name, (h, w) in {'10_5_1.jpg': (40, 100), '10_5_2.jpg': (60, 60), '10_7_1.jpg': (80, 30),
                       '2_3_1.jpg': (50, 70), '2_3_12.jpg': (30, 30)}.items():
    _save(tmp_path, name, _fragment(h, w))
  return str(tmp_path)


def test_parse_name():
  assert reader.parse_name('/data/test/12_345_6.jpg') == (12, 345, 6)
  assert reader.parse_name('0_0_0.JPG') == (0, 0, 0)
  for bad in ['1_2.jpg', 'a_1_2.jpg', '1_2_3.png', '1_2_3.jpg.bak', '1-2-3.jpg', '_1_2_3.jpg']:
    with pytest.raises(reader.DataError, match=re.escape(bad)):
      reader.parse_name(os.path.join('/data', bad))


def test_list_fragments_sorted_numerically(folder):
  items = reader.list_fragments(folder)
  assert [(f.writer, f.page, f.fragment) for f in items] == [
      (2, 3, 1), (2, 3, 12), (10, 5, 1), (10, 5, 2), (10, 7, 1)]
  assert all(os.path.isfile(f.path) for f in items)


def test_load_fragment_colour_and_grey(folder):
  path = os.path.join(folder, '10_5_1.jpg')
  colour = reader.load_fragment(path, color=True)
  grey = reader.load_fragment(path, color=False)
  assert colour.shape == (40, 100, 3) and colour.dtype == np.uint8
  assert grey.shape == (40, 100) and grey.dtype == np.uint8
  # The black corner survives JPEG as near-black, under the threshold.
  assert colour[:8, :20].max() <= reader.BLACK_THRESHOLD


def test_source_records_fit_pad_and_label(folder):
  source = reader.FragmentSource(folder, 64)
  assert len(source) == 5 and source.num_writers == 2 and source.num_pages == 3
  np.testing.assert_array_equal(source.writer_ids, [0, 0, 1, 1, 1])
  np.testing.assert_array_equal(source.page_ids, [0, 0, 1, 1, 2])
  record = source[2]  # 10_5_1.jpg, 40x100: fits as 26x64, centred vertically
  assert record['image'].shape == (64, 64, 3) and record['image'].dtype == np.uint8
  assert record['writer'] == 1 and record['page'] == 1 and record['index'] == 2
  for key in ('writer', 'page', 'index', 'valid_pixels'):
    assert record[key].dtype == np.int32
  rows = np.nonzero(record['image'].max(axis=(1, 2)) > reader.BLACK_THRESHOLD)[0]
  assert rows.min() == 19 and rows.max() == 44  # (64 - 26) // 2 = 19 black rows above
  assert record['image'][:, -1].max() > reader.BLACK_THRESHOLD  # full width used
  expected = 40 * 100 - 10 * 25  # all but the black corner, give or take JPEG's blur
  assert abs(int(record['valid_pixels']) - expected) <= 100
  tall = source[4]['image']  # 10_7_1.jpg, 80x30: fits as 64x24
  cols = np.nonzero(tall.max(axis=(0, 2)) > reader.BLACK_THRESHOLD)[0]
  assert cols.min() == 20 and cols.max() == 43
  grey = reader.FragmentSource(folder, 48, color=False)[0]['image']
  assert grey.shape == (48, 48, 1)


def test_source_is_picklable_and_thread_safe(folder):
  source = reader.FragmentSource(folder, 32)
  copy = pickle.loads(pickle.dumps(source))
  serial = [source[i]['image'] for i in range(len(source))]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    parallel = list(pool.map(lambda i: copy[i % len(copy)]['image'], range(40)))
  for i, image in enumerate(parallel):
    np.testing.assert_array_equal(image, serial[i % len(serial)])


def test_source_feeds_grain(folder):
  source = reader.FragmentSource(folder, 32)
  dataset = grain.MapDataset.source(source).shuffle(seed=0).batch(2)
  batch = dataset[0]
  assert batch['image'].shape == (2, 32, 32, 3) and batch['writer'].shape == (2,)


def test_single_fragment_writer_is_read(tmp_path):
  # Evaluation reads it (its fragment is a query with no relevant item); training refuses
  # it: tests/core/test_bad_inputs.py.
  _save(tmp_path, '4_9_1.jpg', _fragment(30, 50))
  source = reader.FragmentSource(str(tmp_path), 16)
  assert len(source) == 1 and source[0]['writer'] == 0


def test_write_dataset_layout(tmp_path):
  counts = synth.write_dataset(str(tmp_path), writers_train=2, writers_test=1,
                               pages_per_writer=1, seed=0, workers=1, page_size=(500, 700))
  assert sorted(os.listdir(tmp_path)) == ['test', 'train']
  writers = {}
  for split in ('train', 'test'):
    items = reader.list_fragments(str(tmp_path / split))
    assert len(items) == counts[split] >= 2
    writers[split] = {f.writer for f in items}
    for f in items[:3]:
      image = reader.load_fragment(f.path)
      assert image.ndim == 3 and image.shape[2] == 3
      with Image.open(f.path) as im:
        assert im.format == 'JPEG'
  assert writers == {'train': {1, 2}, 'test': {3}}


def _page(writer, page):
  rng = np.random.default_rng([5, writer, page])
  return synth.render_page(synth.page_style(synth.writer_style(5, writer), rng), rng, 300, 420)


def test_writer_style_and_page_are_deterministic():
  assert synth.writer_style(5, 3)['font'] == synth.writer_style(5, 3)['font']
  a, box_a = _page(3, 1)
  b, box_b = _page(3, 1)
  np.testing.assert_array_equal(a, b)
  assert box_a == box_b and a.shape[2] == 3 and a.min() > 0  # no pure black on the page


def test_writers_share_hands_and_pages_vary_their_writer():
  fonts = [synth.writer_style(5, w)['font'] for w in range(1, 3 * synth.WRITERS_PER_HAND + 1)]
  groups = [fonts[i:i + synth.WRITERS_PER_HAND]
            for i in range(0, len(fonts), synth.WRITERS_PER_HAND)]
  assert all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == 3
  style = synth.writer_style(5, 1)
  pages = [synth.page_style(style, np.random.default_rng(p)) for p in range(8)]
  assert all(p['font'] == style['font'] and p['margins'] is style['margins'] for p in pages)
  assert len({round(p['x_height'], 3) for p in pages}) == 8
  assert len({tuple(p['paper'].round(1)) for p in pages}) == 8
  assert all(abs(p['x_height'] / style['x_height'] - 1) < 0.35 for p in pages)


def test_every_font_draws_latin_letters():
  synth.check_fonts()
  for _, name in synth.FONTS:
    assert set(synth.LETTERS) <= set(synth.font_alphabet(name))


def test_valid_pixel_count_is_the_numpy_count():
  rng = np.random.default_rng(0)
  rgb = rng.integers(0, 40, (37, 53, 3), dtype=np.uint8)  # around the black threshold
  expected = int((rgb > reader.BLACK_THRESHOLD).any(axis=-1).sum())
  assert reader.valid_pixel_count(rgb) == expected
