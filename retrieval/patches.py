"""Ink-centred patches at each fragment's own resolution: what the encoder trains and embeds.

Writer identity lives in the shapes of strokes at their real size, so nothing is rescaled:
for each fragment (grey, native resolution)
  1. the fragment's area is its non-black pixels (outside the cut the image is black);
  2. ink is found by Sauvola's local threshold inside that area (retrieval/binarise.py);
  3. difference-of-Gaussians keypoints (retrieval/keypoints.py: SIFT's detector) are found,
     and a keypoint is kept when it lies on ink, its patch (size x size, centred on it) lies
     inside the fragment, and the patch's ink share is within `ink_bounds` (no near-empty
     paper, no solid blots);
  4. up to `max_patches` of them are drawn, seeded by the fragment's name, so the same
     fragment always gives the same patches; a fragment with too few keypoints is topped up
     from other ink pixels that make good patches, and one with none at all gets its
     centre patch.
Patches are stored binarised (ink 255, else 0): paper tone, stains and ink colour change from
page to page of one writer, stroke shapes do not (binarised patches helped Christlein et al.
2017). Training with surrogate classes also needs each patch's SIFT descriptor
(surrogate.py), which OpenCV computes at the chosen patches only.

Steps 1 (counting), 2, 3 and the tests of step 3 run on the device for a batch of fragments
padded to one of a few shapes (retrieval/buckets.py), so nothing recompiles per image; the
host reads the file (retrieval/decode.py, in worker processes) and draws the patches from the maps the
device returns.

This is the sampling of Christlein et al. 2017 and Peer et al. 2023 (32x32 patches at SIFT
keypoints on ink, native scale).
"""
import functools
import itertools
import math
import typing
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from retrieval import binarise, buckets, decode, keypoints, lbp

MAX_PIXELS = 2 ** 23  # of a padded device batch: its float scale space stays under ~1 GB
WINDOW = 64  # fragments grouped into buckets at a time: bounds what waits in memory
INSIDE = 0.1  # at most this share of a patch may lie outside the fragment


class Extracted(typing.NamedTuple):
  patches: np.ndarray  # uint8 [n, size, size], ink 255, n >= 1
  sift: np.ndarray | None  # uint8 [n, 128] when descriptors were asked for
  valid_pixels: int  # pixels inside the fragment
  lbp: np.ndarray | None  # float32 [3072] SRS-LBP features, when asked for


def _count_bounds(size, ink_bounds):
  """Integer ink-pixel and outside-pixel limits equal to the share tests in float64."""
  cells = size * size
  low = next(c for c in range(cells + 1) if c / cells >= ink_bounds[0])
  high = max(c for c in range(cells + 1) if c / cells <= ink_bounds[1])
  return low, high, math.floor(INSIDE * cells)


@functools.partial(jax.jit, static_argnames=('size', 'limits'))
def _maps(grey, area, sizes, *, size, limits):
  """uint8 [B, H, W] of bits: 1 ink at the pixel; 2 a good patch whose top-left corner is the
  pixel (inside, ink share within bounds, ink at its centre); 4 such a patch centred on a
  keypoint."""
  low, high, outside = limits
  ink = binarise.ink_mask_padded(grey, area, sizes)
  ink_count = binarise.box_sum_padded(ink, size)
  good = ((binarise.box_sum_padded(~area, size) <= outside) &
          (ink_count >= low) & (ink_count <= high))
  h, w = good.shape[1:]
  centre = lambda m: m[:, size // 2:size // 2 + h, size // 2:size // 2 + w]
  good &= centre(ink)
  at_keypoint = good & centre(keypoints.detect(grey))
  corners = lambda m: jnp.pad(m, ((0, 0), (0, size - 1), (0, size - 1))).astype(jnp.uint8)
  return ink.astype(jnp.uint8) | corners(good) << 1 | corners(at_keypoint) << 2


def _choose(maps, shape, name, *, size, max_patches, seed):
  """Top-left corners [n, 2] of the fragment's patches from its maps (module docstring)."""
  h, w = max(shape[0], size), max(shape[1], size)  # a small fragment is padded to a patch
  corners = maps[:h - size + 1, :w - size + 1]
  rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
  found = np.flatnonzero(corners & 4)
  if len(found) > max_patches:
    found = found[np.sort(rng.choice(len(found), max_patches, replace=False))]
  if len(found) < max_patches:
    others = np.flatnonzero((corners & 6) == 2)
    found = np.concatenate([found, others[rng.permutation(len(others))[:max_patches - len(found)]]])
  if not len(found):
    return np.array([[(h - size) // 2, (w - size) // 2]])
  return np.stack(np.unravel_index(found, corners.shape), axis=1)


def _descriptors(grey, chosen, size):
  """uint8 [n, 128]: OpenCV's SIFT descriptor of each patch, at the patch's own scale."""
  import cv2  # only surrogate training needs it
  cv2.setNumThreads(1)  # one thread a worker: the pool is the parallelism
  pad = ((0, max(0, size - grey.shape[0])), (0, max(0, size - grey.shape[1])))
  points = [cv2.KeyPoint(l + size / 2, t + size / 2, size / 2) for t, l in chosen]
  points, found = cv2.SIFT_create().compute(np.pad(grey, pad), points)
  if found is None or len(points) != len(chosen):  # OpenCV dropped a point at the border
    found = np.zeros((len(chosen), 128), np.float32)
  return np.clip(found, 0, 255).astype(np.uint8)


def extract_many(items, *, size, max_patches, ink_bounds, seed, with_lbp=False,
                 descriptors=False):
  """Extracted for each (name, decode.Prepared) of `items`, in order (a generator: `items` is
  read a WINDOW at a time); an item whose Prepared is a string (why a file could not be read)
  passes through as that string. with_lbp: SRS-LBP features too (Prepared.lbp_mask set)."""
  limits = _count_bounds(size, ink_bounds)
  items = iter(items)
  while window := list(itertools.islice(items, WINDOW)):
    out = [p if isinstance(p, str) else None for _, p in window]
    usable = [r for r, (_, p) in enumerate(window) if not isinstance(p, str)]
    pending = []
    # A fragment smaller than a patch is padded to one (its patch holds the padding).
    shapes = [(max(window[r][1].grey.shape[0], size), max(window[r][1].grey.shape[1], size))
              for r in usable]
    for shape, rows, batch in buckets.groups(shapes, MAX_PIXELS):
      rows = [usable[r] for r in rows]
      taken = [window[r][1] for r in rows]
      grey = jax.device_put(buckets.pad([p.grey for p in taken], shape, batch))
      area = jax.device_put(buckets.pad([p.area for p in taken], shape, batch))
      sizes = np.zeros((batch, 2), np.int32)
      sizes[:len(taken)] = [p.grey.shape for p in taken]
      sizes[len(taken):] = 1
      maps = _maps(grey, area, sizes, size=size, limits=limits)  # runs while LBP waits
      features = None
      if with_lbp:
        features = lbp.features_padded(
            grey, jax.device_put(buckets.pad([p.lbp_mask for p in taken], shape, batch)))
      pending.append((rows, maps, features))
    for rows, maps, features in pending:
      maps = np.asarray(maps)
      for k, r in enumerate(rows):
        name, p = window[r]
        chosen = _choose(maps[k], p.grey.shape, name, size=size, max_patches=max_patches,
                         seed=seed)
        ink = maps[k] & 1
        cut = np.stack([ink[t:t + size, l:l + size] for t, l in chosen]) * np.uint8(255)
        out[r] = Extracted(cut, _descriptors(p.grey, chosen, size) if descriptors else None,
                           int(p.area.sum()), None if features is None else features[k])
    yield from out


def extract(rgb, name, *, size, max_patches, ink_bounds, seed, with_lbp=False,
            descriptors=False):
  """Extracted of one RGB uint8 [H, W, 3] fragment (extract_many of one)."""
  return next(extract_many([(name, decode.prepare(rgb, with_lbp))], size=size,
                           max_patches=max_patches, ink_bounds=ink_bounds, seed=seed,
                           with_lbp=with_lbp, descriptors=descriptors))
