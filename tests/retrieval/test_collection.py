"""A scholar's folder of images (retrieval/collections/collection.py): listed whatever its names and
nesting, and read to the HisFrag20 convention whatever surrounds the fragment."""
import os

import numpy as np
import pytest
from PIL import Image

from retrieval.collections import collection
from retrieval.fragments import reader


def canonical(seed=0, size=(60, 80)):
  """A fragment as HisFrag20 stores it: outside black, inside paper with dark ink."""
  rng = np.random.default_rng(seed)
  h, w = size
  yy, xx = np.mgrid[:h, :w]
  inside = ((yy - h / 2) / (h / 2.2)) ** 2 + ((xx - w / 2) / (w / 2.2)) ** 2 < 1
  rgb = rng.integers(150, 230, (h, w, 3)).astype(np.uint8)
  rgb[20:24, 10:70] = rng.integers(30, 60, 3)  # a stroke of ink
  rgb[~inside] = 0
  return rgb, inside


def test_alpha_surround_reads_as_black_outside(tmp_path):
  rgb, inside = canonical()
  junk = np.where(inside[..., None], rgb, 255)  # what lies under transparency is not read
  rgba = np.dstack([junk, np.where(inside, 255, 0).astype(np.uint8)])
  Image.fromarray(rgba, 'RGBA').save(tmp_path / 'f.png')
  np.testing.assert_array_equal(collection.read_fragment(str(tmp_path / 'f.png')), rgb)


def test_white_surround_is_cut_away_and_black_ink_stays_inside(tmp_path):
  rgb, inside = canonical()
  rgb[30, 30] = 0  # ink as black as a HisFrag20 outside
  white = np.where(inside[..., None], rgb, 255).astype(np.uint8)
  Image.fromarray(white).save(tmp_path / 'f.png')
  expected = rgb.copy()
  expected[30, 30] = reader.BLACK_THRESHOLD + 1
  read = collection.read_fragment(str(tmp_path / 'f.png'))
  np.testing.assert_array_equal(read, expected)
  assert read.max(axis=-1)[inside].min() > reader.BLACK_THRESHOLD  # all of it still inside


def test_black_surround_reads_as_the_hisfrag20_reader_reads_it(tmp_path):
  rgb, _ = canonical()
  Image.fromarray(rgb).save(tmp_path / '1_2_3.jpg', quality=90)
  path = str(tmp_path / '1_2_3.jpg')
  np.testing.assert_array_equal(collection.read_fragment(path), reader.decode(path))


def test_a_photo_without_surround_is_all_fragment_and_16_bit_grey_is_scaled(tmp_path):
  grey = (np.arange(40 * 50, dtype=np.uint16).reshape(40, 50) * 20 + 3000)
  Image.fromarray(grey).save(tmp_path / 'scan.tif')
  read = collection.read_fragment(str(tmp_path / 'scan.tif'))
  assert read.shape == (40, 50, 3)
  assert read.max() == 255 and (read.max(axis=-1) > reader.BLACK_THRESHOLD).all()


@pytest.mark.parametrize('content, why', [(b'', 'empty file'), (b'not an image', 'unreadable'),
                                          (None, 'nothing inside'), ('link', 'no such file')])
def test_unusable_images_are_named(tmp_path, content, why):
  path = tmp_path / 'bad.png'
  if content is None:
    Image.fromarray(np.zeros((8, 8, 4), np.uint8), 'RGBA').save(path)  # all transparent
  elif content == 'link':
    path.symlink_to(tmp_path / 'moved-away.png')  # a link to nothing
  else:
    path.write_bytes(content)
  with pytest.raises(collection.Unreadable, match=why) as error:
    collection.read_fragment(str(path))
  assert str(path) in str(error.value)


def test_listing_follows_nested_folders_and_names_what_it_leaves_out(tmp_path):
  for name in ['b/c/x.TIF', 'b/y.jpeg', 'a.png', '.hidden/z.png', 'notes.txt', '.DS_Store']:
    os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
    (tmp_path / name).write_bytes(b'')
  (tmp_path / 'b' / 'c' / 'up').symlink_to(tmp_path / 'b')  # a cycle: b/c/up -> b
  (tmp_path / 'again').symlink_to(tmp_path / 'b' / 'c')  # a second way into b/c
  outside = tmp_path.parent / f'{tmp_path.name}-elsewhere'
  (outside / 'loop').mkdir(parents=True)
  (outside / 'w.png').write_bytes(b'')
  (outside / 'loop' / 'back').symlink_to(outside)  # a cycle outside the root
  (tmp_path / 'linked').symlink_to(outside)  # a folder elsewhere, linked in: followed
  listing = collection.list_images(str(tmp_path))
  assert listing.paths == ['a.png', 'b/c/x.TIF', 'b/y.jpeg', 'linked/w.png']
  assert listing.others == ['notes.txt']
  assert listing.hidden == ['.DS_Store', '.hidden']
  assert listing.repeated == ['again', 'b/c/up', 'linked/loop/back']
  (tmp_path / 'empty').mkdir()
  with pytest.raises(reader.DataError, match='no images'):
    collection.list_images(str(tmp_path / 'empty'))
  with pytest.raises(reader.DataError, match='no such folder'):
    collection.list_images(str(tmp_path / 'missing'))
