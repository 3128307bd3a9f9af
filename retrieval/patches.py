"""Ink-centred patches at each fragment's own resolution: what the encoder trains and embeds.

Writer identity lives in the shapes of strokes at their real size, so nothing is rescaled:
for each fragment (grey, native resolution)
  1. the fragment's area is its non-black pixels (outside the cut the image is black);
  2. ink is found by Sauvola's local threshold (scikit-image) inside that area;
  3. SIFT keypoints (OpenCV) are detected on the grey image, and a keypoint is kept when it
     lies on ink, its patch (size x size, centred on it) lies inside the fragment, and the
     patch's ink share is within `ink_bounds` (no near-empty paper, no solid blots);
  4. up to `max_patches` of them are drawn, seeded by the fragment's name, so the same
     fragment always gives the same patches; a fragment with too few keypoints is topped up
     from random ink pixels, and one with none at all gets its centre patch.
Patches are stored binarised (ink 255, else 0): paper tone, stains and ink colour change from
page to page of one writer, stroke shapes do not (binarised patches helped Christlein et al.
2017). The SIFT descriptor of each patch is kept for surrogate-class labelling (surrogate.py).

This is the sampling of Christlein et al. 2017 and Peer et al. 2023 (32x32 patches at SIFT
keypoints on ink, native scale).
"""
import cv2
import numpy as np
import zlib
from skimage.filters import threshold_sauvola

from retrieval import reader

SAUVOLA_WINDOW = 25  # px: a few stroke widths at HisFrag20's resolution


def ink_mask(gray, area):
  """bool [H, W]: dark strokes (Sauvola) inside the fragment `area`."""
  threshold = threshold_sauvola(gray, window_size=SAUVOLA_WINDOW, k=0.2)
  return (gray < threshold) & area


def _box_sum(mask, size):
  """Sum of `mask` over the size x size box whose top-left corner is at each pixel."""
  table = np.pad(mask.astype(np.int32).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
  return (table[size:, size:] - table[:-size, size:] - table[size:, :-size] +
          table[:-size, :-size])


def extract(rgb, name, *, size, max_patches, ink_bounds, seed):
  """(patches uint8 [n, size, size] (ink 255), sift uint8 [n, 128]) of one fragment, n >= 1."""
  gray = np.asarray(reader.convert(rgb, color=False))
  area = rgb.max(axis=-1) > reader.BLACK_THRESHOLD
  ink = ink_mask(gray, area)
  h, w = gray.shape
  if h < size or w < size:  # smaller than one patch: pad with background
    pad = ((0, max(0, size - h)), (0, max(0, size - w)))
    gray, area, ink = np.pad(gray, pad), np.pad(area, pad), np.pad(ink, pad)
    h, w = gray.shape
  ink_share = _box_sum(ink, size) / size**2  # [h - size + 1, w - size + 1], by top-left
  inside = _box_sum(~area, size) <= 0.1 * size**2
  good = inside & (ink_share >= ink_bounds[0]) & (ink_share <= ink_bounds[1])

  sift = cv2.SIFT_create()
  # Detection and description share one scale-space pyramid; SIFT is ~70 % of the time.
  keypoints, descriptors = sift.detectAndCompute(gray, area.astype(np.uint8))
  rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
  corners = {}  # top-left corner -> the first keypoint's descriptor (one patch a location)
  for kp, descriptor in zip(keypoints, descriptors if descriptors is not None else []):
    x, y = int(round(kp.pt[0])), int(round(kp.pt[1]))
    top, left = y - size // 2, x - size // 2
    if (0 <= top <= h - size and 0 <= left <= w - size and ink[y, x] and good[top, left]):
      corners.setdefault((top, left), descriptor)
  chosen = list(corners)
  if len(chosen) > max_patches:
    chosen = [chosen[i] for i in np.sort(rng.choice(len(chosen), max_patches, replace=False))]
  found = [corners[c] for c in chosen]
  extra = []
  if len(chosen) < max_patches:  # top up from random ink pixels that make good patches
    tops, lefts = np.nonzero(good & ink[size // 2:h - size + 1 + size // 2,
                                        size // 2:w - size + 1 + size // 2])
    picks = rng.permutation(len(tops))[:max_patches - len(chosen)]
    extra = [(int(tops[i]), int(lefts[i])) for i in picks
             if (tops[i], lefts[i]) not in corners]
  if not chosen and not extra:
    extra = [((h - size) // 2, (w - size) // 2)]
  if extra:  # described at the patch's own scale
    points = [cv2.KeyPoint(l + size / 2, t + size / 2, size / 2) for t, l in extra]
    points, more = sift.compute(gray, points)
    if more is None or len(points) != len(extra):  # OpenCV dropped a point at the border
      more = np.zeros((len(extra), 128), np.float32)
    found += list(more)
    chosen += extra
  patches = np.stack([ink[t:t + size, l:l + size] for t, l in chosen]).astype(np.uint8) * 255
  return patches, np.clip(np.stack(found), 0, 255).astype(np.uint8)
