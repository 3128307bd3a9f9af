"""Ink-centred patches at each fragment's own resolution: what the encoder trains and embeds.

Writer identity lives in the shapes of strokes at their real size, so nothing is rescaled:
for each fragment (grey, native resolution)
  1. the fragment's area is its non-black pixels (outside the cut the image is black);
  2. ink is found by Sauvola's local threshold inside that area;
  3. SIFT keypoints (OpenCV's detector) are found, and a keypoint is kept when it lies on
     ink, its patch (size x size, centred on it) lies inside the fragment, and the patch's
     ink share is within `ink_bounds` (no near-empty paper, no solid blots);
  4. up to `max_patches` of them are drawn, seeded by the fragment's name, so the same
     fragment always gives the same patches; a fragment with too few keypoints is topped up
     from random ink pixels that make good patches, and one with none at all gets its centre
     patch.
Patches are stored binarised (ink 255, else 0): paper tone, stains and ink colour change from
page to page of one writer, stroke shapes do not (binarised patches helped Christlein et al.
2017). Training with surrogate classes also needs each patch's SIFT descriptor
(surrogate.py), computed for the chosen patches only.

Where the work runs: worker processes read each file once and detect its keypoints
(retrieval/features/decode.py). On an accelerator, steps 2 and 3's tests (Sauvola, box sums) and
SRS-LBP run on the device for a batch of fragments padded to one of a few shapes
(retrieval/features/binarise.py, retrieval/features/buckets.py, retrieval/features/lbp.py); on a CPU-only machine the
workers compute the same maps in numpy and scikit-image, which are faster there and compile
nothing (bench/fragment_features.py measures both). The draw is the host's either way, and
the patches are the same.

This is the sampling of Christlein et al. 2017 and Peer et al. 2023 (32x32 patches at SIFT
keypoints on ink, native scale).
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from retrieval.features import binarise, buckets, decode, lbp

MAX_PIXELS = 2 ** 24  # of a padded device batch
@functools.partial(jax.jit, static_argnames=('size', 'limits'))
def device_maps(grey, area, sizes, *, size, limits):
  """decode.host_maps for a padded batch: uint8 [B, H, W] of grey uint8 and area bool
  [B, H, W], each image's true (h, w) in sizes int32 [B, 2]."""
  low, high, outside = limits
  ink = binarise.ink_mask_padded(grey, area, sizes)
  count = binarise.box_sum_padded(ink, size)
  good = ((binarise.box_sum_padded(~area, size) <= outside) & (count >= low) & (count <= high))
  h, w = good.shape[1:]
  good &= ink[:, size // 2:size // 2 + h, size // 2:size // 2 + w]
  corners = jnp.pad(good, ((0, 0), (0, size - 1), (0, size - 1))).astype(jnp.uint8)
  return ink.astype(jnp.uint8) | corners << 1


def _on_device(window, size, limits, with_lbp):
  """{row of window: (maps, SRS-LBP features or None)} of its decode.Prepared items."""
  rows = [r for r, (_, p) in enumerate(window) if not isinstance(p, str)]
  shapes = [(max(window[r][1].grey.shape[0], size), max(window[r][1].grey.shape[1], size))
            for r in rows]
  pending = []
  for shape, group, batch in buckets.groups(shapes, MAX_PIXELS):
    taken = [window[rows[k]][1] for k in group]
    grey = jax.device_put(buckets.pad([p.grey for p in taken], shape, batch))
    sizes = np.ones((batch, 2), np.int32)
    sizes[:len(taken)] = [p.grey.shape for p in taken]
    area = buckets.pad([p.area for p in taken], shape, batch)
    maps = device_maps(grey, area, sizes, size=size, limits=limits)  # runs while LBP waits
    features = [None] * len(taken)
    if with_lbp:
      features = lbp.features_padded(grey, buckets.pad([p.lbp_mask for p in taken], shape,
                                                       batch))
    pending.append(([rows[k] for k in group], maps, features))
  out = {}
  for group, maps, features in pending:
    maps = np.asarray(maps)
    out.update({r: (maps[k], features[k]) for k, r in enumerate(group)})
  return out


def extract_many(items, *, size, max_patches, ink_bounds, seed, with_lbp=False,
                 descriptors=False):
  """decode.Extracted for each (name, decode.Prepared) of `items`, on the device, in order (a
  generator: `items` is read a WINDOW at a time); an item whose Prepared is a string (why a
  file could not be read) passes through as that string."""
  limits = decode.count_limits(size, ink_bounds)
  items = iter(items)
  while window := list(itertools.islice(items, buckets.WINDOW)):
    computed = _on_device(window, size, limits, with_lbp)
    for r, (name, p) in enumerate(window):
      if isinstance(p, str):
        yield p
        continue
      maps, features = computed[r]
      patches, sift = decode.cut(p.grey, p.keypoints, maps, name, size=size,
                                 max_patches=max_patches, seed=seed,
                                 with_descriptors=descriptors)
      yield decode.Extracted(patches, sift, int(p.area.sum()), features if with_lbp else None)


def extract_all(read, indices, names, *, size, max_patches, ink_bounds, seed, with_lbp=False,
                descriptors=False, skip=()):
  """decode.Extracted (or the message of a file skipped for an exception of the types `skip`) of
  read(i) for each of `indices`, named `names`, in order: each file read once in worker
  processes, which on a CPU-only machine do all of it."""
  names = list(names)
  if not buckets.on_device():
    work = functools.partial(decode.extract, size=size, max_patches=max_patches,
                             ink_bounds=ink_bounds, seed=seed, with_lbp=with_lbp,
                             with_descriptors=descriptors)
    return decode.each(read, indices, names, work, skip=skip)
  prepared = decode.each(read, indices, names,
                         functools.partial(decode.prepare, lbp_mask=with_lbp), skip=skip)
  return extract_many(zip(names, prepared), size=size, max_patches=max_patches,
                      ink_bounds=ink_bounds, seed=seed, with_lbp=with_lbp,
                      descriptors=descriptors)


def extract(rgb, name, *, size, max_patches, ink_bounds, seed, with_lbp=False,
            descriptors=False):
  """decode.Extracted of one RGB uint8 [H, W, 3] fragment."""
  return next(extract_all(lambda _: rgb, [0], [name], size=size, max_patches=max_patches,
                          ink_bounds=ink_bounds, seed=seed, with_lbp=with_lbp,
                          descriptors=descriptors))
