"""The HisFrag20 fragmenter: properties of the pieces on a small synthetic page, and the CLI."""
import dataclasses
import os
import re

import numpy as np
from PIL import Image
import pytest

from retrieval.synthetic import fragments
from conftest import run_module

TEXT_BOX = (60, 40, 660, 460)  # top, left, bottom, right
SEEDS = range(5)


def _page(seed=0):
  """A 720x500 'page': paper with dark text-like bars inside TEXT_BOX, no pure black.

  Page-sized, because cut widths are in pixels: on a much smaller page they eat more of it.
  """
  rng = np.random.default_rng(seed)
  page = np.full((720, 500, 3), (220, 200, 160), np.uint8)
  page += rng.integers(0, 20, page.shape, dtype=np.uint8)
  top, left, bottom, right = TEXT_BOX
  for y in range(top, bottom - 10, 20):
    for x in range(left, right - 30, 40):
      page[y:y + 10, x:x + int(rng.integers(20, 36))] = (60, 40, 30)
  return page


def _cut(mode, seed, page=None):
  params = fragments.FragmentParams(rect_prob=1.0 if mode == 'wavy' else 0.0)
  page = _page() if page is None else page
  return fragments.cut_page(page, np.random.default_rng(seed), params, TEXT_BOX), params


@pytest.mark.parametrize('mode', ['shapes', 'wavy'])
def test_pieces_are_disjoint_large_and_black_outside(mode):
  page = _page()
  top, left, bottom, right = TEXT_BOX
  text_area = (bottom - top) * (right - left)
  coverages = []
  for seed in SEEDS:
    pieces, params = _cut(mode, seed, page)
    assert len(pieces) >= 2
    owner = np.zeros(page.shape[:2], np.int32)
    for i, (image, mask, (y, x)) in enumerate(pieces, start=1):
      assert image.shape[:2] == mask.shape and image.dtype == np.uint8
      # Cropped to the bounding box: the mask touches all four sides.
      assert mask[0].any() and mask[-1].any() and mask[:, 0].any() and mask[:, -1].any()
      assert mask.sum() >= params.min_share * text_area
      assert (image[~mask] == 0).all()
      window = (slice(y, y + mask.shape[0]), slice(x, x + mask.shape[1]))
      np.testing.assert_array_equal(image[mask], page[window][mask])
      assert (owner[window][mask] == 0).all(), 'pieces overlap'
      owner[window][mask] = i
    coverages.append((owner[top:bottom, left:right] > 0).mean())
  # Cuts and dropped specks take a little of the text; the pieces hold the rest.
  assert min(coverages) >= 0.85 and np.mean(coverages) >= 0.9, coverages


@pytest.mark.parametrize('mode', ['shapes', 'wavy'])
def test_deterministic_by_seed(mode):
  first, _ = _cut(mode, 7)
  again, _ = _cut(mode, 7)
  other, _ = _cut(mode, 8)
  assert len(first) == len(again)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.mask, b.mask)
    assert a.offset == b.offset
  assert [p.offset for p in first] != [p.offset for p in other]


def test_grey_page_and_found_text_box():
  page = _page()
  rows, cols = np.nonzero(page.mean(axis=2) < 100)
  ink_box = (rows.min(), cols.min(), rows.max() + 1, cols.max() + 1)
  found = fragments.find_text_box(page, ink_delta=60)
  # Within a few pixels: the extreme 0.5 % of ink on each side is taken for specks.
  assert np.abs(np.subtract(found, ink_box)).max() <= 8, (found, ink_box)
  pieces = fragments.cut_page(page.mean(axis=2).astype(np.uint8), np.random.default_rng(0),
                              fragments.FragmentParams())
  assert pieces and all(p.image.ndim == 2 for p in pieces)


def test_fractals_have_requested_shapes():
  rng = np.random.default_rng(0)
  assert fragments.diamond_square(37, 81, 3, 0.8, rng).shape == (37, 81)
  line = fragments.midpoint_displacement(100, 0.6, rng)
  assert line.shape == (100,) and np.abs(line).max() < 4


def test_bad_params_and_pages_are_refused():
  with pytest.raises(ValueError, match='min_share'):
    fragments.FragmentParams(min_share=0)
  with pytest.raises(ValueError, match='rect_'):
    fragments.FragmentParams(rect_rows_min=3, rect_rows_max=2)
  with pytest.raises(ValueError, match='text box'):
    fragments.cut_page(_page(), np.random.default_rng(0), fragments.FragmentParams(),
                       (0, 0, 999, 10))
  with pytest.raises(ValueError, match='uint8'):
    fragments.cut_page(np.zeros((50, 50), np.float32), np.random.default_rng(0),
                       fragments.FragmentParams())


def test_params_fill_from_a_dict():
  params = fragments.FragmentParams(**{'margin': 6.0, 'rect_prob': 0.5})
  assert dataclasses.replace(params, margin=10.0).margin == 10.0


def test_cli_cuts_a_folder_of_pages(tmp_path):
  pages, out = tmp_path / 'pages', tmp_path / 'out'
  pages.mkdir()
  Image.fromarray(_page(1)).save(pages / '3_17.png')
  Image.fromarray(_page(2)).save(pages / '4_18.jpg', quality=95)
  run_module('retrieval.synthetic.fragments', '--pages', pages, '--out', out, '--seed', 1,
             '--workers', 2, '--margin', 6.0)
  names = sorted(os.listdir(out))
  assert {n.split('_')[0] + '_' + n.split('_')[1] for n in names} == {'3_17', '4_18'}
  for name in names:
    with Image.open(out / name) as image:
      assert image.format == 'JPEG' and image.mode == 'RGB'


def test_badly_named_page_is_reported(tmp_path):
  Image.fromarray(_page()).save(tmp_path / 'page1.png')
  with pytest.raises(ValueError, match='page1.png'):
    fragments.fragment_pages(str(tmp_path), str(tmp_path / 'out'),
                             fragments.FragmentParams())


def test_duplicate_page_ids_and_used_out_dir_are_refused(tmp_path):
  pages, out = tmp_path / 'pages', tmp_path / 'out'
  pages.mkdir()
  out.mkdir()
  Image.fromarray(_page()).save(pages / '1_2.png')
  (out / 'old.jpg').write_bytes(b'x')
  with pytest.raises(ValueError, match=re.escape(str(out))):
    fragments.fragment_pages(str(pages), str(out), fragments.FragmentParams())
  Image.fromarray(_page()).save(pages / '1_2.jpg')
  with pytest.raises(ValueError, match='1_2.png'):
    fragments.fragment_pages(str(pages), str(tmp_path / 'new'), fragments.FragmentParams())
