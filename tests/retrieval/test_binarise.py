"""retrieval/features/binarise.py against scikit-image's Sauvola and plain box sums, on synthetic
fragments and noise of several sizes padded into shared buckets."""
import os

import numpy as np
import pytest
from skimage.filters import threshold_sauvola

from retrieval.features import binarise, buckets
from retrieval.fragments import reader


def padded_groups(images, areas):
  """[(rows, grey, area, sizes)] for each bucket group of `images`; the padding of grey
  holds noise, which no result may read."""
  rng = np.random.default_rng(7)
  out = []
  for shape, rows, batch in buckets.groups([x.shape for x in images]):
    grey = rng.integers(0, 256, (batch,) + shape).astype(np.uint8)
    for k, r in enumerate(rows):
      grey[k, :images[r].shape[0], :images[r].shape[1]] = images[r]
    sizes = np.zeros((batch, 2), np.int32)
    sizes[:len(rows)] = [images[r].shape for r in rows]
    out.append((rows, grey, buckets.pad([areas[r] for r in rows], shape, batch, fill=False),
                sizes))
  return out


def assert_like_scikit_image(images, areas):
  """Every image's ink mask, computed in padded batches, agrees with scikit-image's on
  >= 99.99 % of its pixels, and disagrees only where the grey level is within 1e-3 of
  scikit-image's threshold; the padding holds no ink."""
  groups = padded_groups(images, areas)
  assert any(len(rows) > 1 for rows, *_ in groups)
  for rows, grey, area, sizes in groups:
    got = np.asarray(binarise.ink_mask_padded(grey, area, sizes))
    for k, r in enumerate(rows):
      h, w = images[r].shape
      threshold = threshold_sauvola(images[r], window_size=25, k=0.2)
      differ = got[k, :h, :w] != ((images[r] < threshold) & areas[r])
      assert differ.mean() <= 1e-4, (images[r].shape, differ.sum())
      assert (np.abs(images[r][differ] - threshold[differ]) < 1e-3).all()
      assert not got[k, h:].any() and not got[k, :, w:].any()


def test_ink_mask_equals_scikit_image_on_fragments(fragment_data):
  folder = os.path.join(fragment_data, 'test')
  images, areas = [], []
  for name in sorted(os.listdir(folder))[:8]:
    rgb = reader.decode(os.path.join(folder, name))
    images.append(np.asarray(reader.convert(rgb, color=False)))
    areas.append(rgb.max(axis=-1) > reader.BLACK_THRESHOLD)  # as retrieval/features/patches.py
  assert_like_scikit_image(images, areas)


def test_ink_mask_equals_scikit_image_on_noise():
  # Ink at the image's own edge everywhere; sides under the window's half (12) reflect
  # more than once.
  rng = np.random.default_rng(0)
  shapes = [(100, 77), (90, 70), (40, 300), (5, 7), (1, 30), (13, 13), (64, 64)]
  images = [rng.integers(0, 256, s).astype(np.uint8) for s in shapes]
  assert_like_scikit_image(images, [rng.random(s) < 0.9 for s in shapes])


def test_ink_mask_without_sizes_takes_the_whole_array():
  rng = np.random.default_rng(1)
  grey = rng.integers(0, 256, (2, 40, 50)).astype(np.uint8)
  got = np.asarray(binarise.ink_mask_padded(grey, np.ones(grey.shape, bool)))
  for g, m in zip(grey, got):
    differ = m != (g < threshold_sauvola(g, window_size=25, k=0.2))
    assert differ.mean() <= 1e-4


def box_sums(x, size):
  """The plain definition: each size x size window summed."""
  windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.int64), (size, size))
  return windows.sum(axis=(-2, -1))


def test_box_sums_are_exact_and_survive_overflow():
  rng = np.random.default_rng(2)
  mask = rng.random((3, 70, 90)) < 0.3
  for size in (1, 25, 32, 70):
    got = np.asarray(binarise.box_sum_padded(mask, size))
    assert got.dtype == np.int32 and got.shape == (3, 71 - size, 91 - size)
    for k in range(3):
      np.testing.assert_array_equal(got[k], box_sums(mask[k], size))
  # Squares of grey levels over 700 x 700: the cumulative sums pass 2^31 (wrap),
  # the windows' sums do not.
  squares = rng.integers(0, 256, (1, 700, 700)).astype(np.int32) ** 2
  assert squares.astype(np.int64).sum() > 2**31
  np.testing.assert_array_equal(np.asarray(binarise.box_sum_padded(squares, 25))[0],
                                box_sums(squares[0], 25))
  with pytest.raises(ValueError, match='does not fit'):
    binarise.box_sum_padded(mask, 71)


def test_mean_and_std_do_not_cancel():
  # Bright windows that barely vary: n * squares and total^2 agree to 7 digits, so a float32
  # difference of the two would lose the variance entirely.
  n = 625
  windows = [np.full(n, 255), np.r_[np.full(n - 1, 255), 254], np.r_[np.full(n - 2, 200), 3, 4],
             np.arange(n) % 256]
  total = np.array([w.sum() for w in windows], np.int32)
  squares = np.array([(w.astype(np.int64) ** 2).sum() for w in windows], np.int32)
  mean, std = map(np.asarray, binarise._mean_std(total, squares, n))
  np.testing.assert_allclose(mean, [w.mean() for w in windows], rtol=1e-7)
  np.testing.assert_allclose(std, [w.std() for w in windows], rtol=1e-6)
