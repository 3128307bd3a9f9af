"""retrieval/binarise.py against scikit-image's Sauvola and numpy's box sums
(bench/reference_patches.py: the code it replaced), images of several sizes padded into
shared buckets."""
import os

import numpy as np

from bench import reference_patches
from retrieval import binarise, buckets, reader


def padded(images, masks):
  """[(rows, grey, area, sizes)] of every bucket group of `images`."""
  out = []
  for shape, rows, batch in buckets.groups([x.shape for x in images]):
    sizes = np.ones((batch, 2), np.int32)
    sizes[:len(rows)] = [images[r].shape for r in rows]
    out.append((rows, buckets.pad([images[r] for r in rows], shape, batch),
                buckets.pad([masks[r] for r in rows], shape, batch), sizes))
  return out


def test_ink_equals_scikit_image_sauvola_at_every_pixel(fragment_data):
  folder = os.path.join(fragment_data, 'test')
  images, areas = [], []
  for name in sorted(os.listdir(folder))[:5]:
    rgb = reader.decode(os.path.join(folder, name))
    images.append(np.asarray(reader.convert(rgb, color=False)))
    areas.append(rgb.max(axis=-1) > reader.BLACK_THRESHOLD)
  rng = np.random.default_rng(0)
  for shape in [(100, 77), (90, 70), (40, 300)]:  # noise, and ink at the image's own edge
    images.append(rng.integers(0, 256, shape).astype(np.uint8))
    areas.append(np.ones(shape, bool))
  for rows, grey, area, sizes in padded(images, areas):
    got = np.asarray(binarise.ink_mask_padded(grey, area, sizes))
    for k, r in enumerate(rows):
      h, w = images[r].shape
      want = reference_patches.ink_mask(images[r], areas[r])
      assert (got[k, :h, :w] == want).mean() >= 0.9999, images[r].shape
      assert not got[k, h:].any() and not got[k, :, w:].any()  # nothing in the padding


def test_box_sums_equal_numpy_and_survive_overflow():
  rng = np.random.default_rng(1)
  mask = rng.random((2, 70, 90)) < 0.3
  got = np.asarray(binarise.box_sum_padded(mask, 32))
  for k in range(2):
    np.testing.assert_array_equal(got[k], reference_patches._box_sum(mask[k], 32))
  # Squares of a bright 3,000 x 3,000 image: the cumulative sum passes 2^31, windows do not.
  big = np.full((1, 3000, 3000), 255 * 255, np.int32)
  assert (np.asarray(binarise.box_sum_padded(big, 25)) == 625 * 255 * 255).all()
