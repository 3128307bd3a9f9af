"""SRS-LBP in numpy, on the host: what a CPU-only machine runs, in its worker processes, and
the reference retrieval/features/lbp.py's jitted kernels equal (tests/retrieval/test_lbp.py).

The method is retrieval/features/lbp.py's docstring. On a CPU these numpy passes beat the kernels
(~125 ms of one core per 670 x 670 fragment against ~160 ms, and nothing to compile per
shape: bench/fragment_features.py); on an accelerator the kernels take the work off the host.
No jax here: worker processes import this module.
"""

import math

import numpy as np
from scipy import ndimage

RADII = tuple(range(1, 13))
NUM_BINS = 256


def fragment_mask(gray, black_level=8):
  """Fragment area of a fragment image: not black, with holes filled.

  Filling holes keeps dark ink strokes inside the fragment; `black_level` absorbs JPEG noise
  in the black surround.
  """
  return ndimage.binary_fill_holes(np.asarray(gray) > black_level)


def lbp_codes(gray, radius, threshold=0):
  """uint8 LBP codes of the pixels at least ceil(radius) away from the image border.

  Returns [H - 2R, W - 2R] with R = ceil(radius); code bit p is set when the bilinear sample
  of neighbour p, rounded, exceeds centre + threshold.
  """
  grey = _grey(gray)
  return _codes(_rounded_samples(grey, radius), _centre(grey, radius), threshold)


def lbp_features(gray, mask=None, *, radii=RADII, threshold='otsu'):
  """SRS-LBP histograms of a grey uint8 image -> float32 [len(radii) * 256].

  `mask`: bool [H, W] fragment area; None derives it with `fragment_mask`. `threshold`:
  'otsu' (per image and radius, as the baseline) or a fixed integer.
  """
  grey = _grey(gray)
  mask = fragment_mask(grey) if mask is None else np.asarray(mask, bool)
  if mask.shape != grey.shape:
    raise ValueError(f'mask shape {mask.shape} does not match image shape {grey.shape}')
  blocks = []
  for r in radii:
    hist = np.zeros(NUM_BINS, np.float64)
    valid = _valid_centres(mask, r)
    if valid.any():
      samples, centre = _rounded_samples(grey, r), _centre(grey, r)
      t = _otsu_threshold(samples, centre, valid) if threshold == 'otsu' else int(threshold)
      hist = np.bincount(_codes(samples, centre, t)[valid], minlength=NUM_BINS).astype(np.float64)
      hist[0] = 0.0
      if hist.sum() > 0:
        hist /= hist.sum()
    blocks.append(hist)
  return np.concatenate(blocks).astype(np.float32)


def offsets(radius):
  """Per neighbour p: its bilinear taps [(dy, dx, weight)] (zero weights dropped)."""
  out = []
  for p in range(8):
    angle = 2 * math.pi * p / 8
    pos = [radius * math.sin(angle), radius * math.cos(angle)]  # (dy, dx)
    # cos(pi/2) * r is 6e-17, not 0: snap so axis neighbours read one pixel, not two.
    pos = [round(v) if abs(v - round(v)) < 1e-9 else v for v in pos]
    (y0, fy), (x0, fx) = [(math.floor(v), v - math.floor(v)) for v in pos]
    taps = [(y0, x0, (1 - fy) * (1 - fx)), (y0, x0 + 1, (1 - fy) * fx),
            (y0 + 1, x0, fy * (1 - fx)), (y0 + 1, x0 + 1, fy * fx)]
    out.append([t for t in taps if t[2] > 0])
  return out


def _grey(gray):
  img = np.asarray(gray)
  if img.ndim != 2 or img.dtype != np.uint8:
    raise ValueError(f'expected a 2-D uint8 grey image, got {img.dtype} {img.shape}')
  return img.astype(np.int16)


def _centre(grey, radius):
  big = math.ceil(radius)
  return grey[big:grey.shape[0] - big, big:grey.shape[1] - big]


def _rounded_samples(grey, radius):
  """The 8 neighbour samples over the interior [H - 2R, W - 2R] as int16 grey levels."""
  big = math.ceil(radius)
  h, w = grey.shape[0] - 2 * big, grey.shape[1] - 2 * big
  img = grey.astype(np.float32)
  out = []
  for taps in offsets(radius):
    if len(taps) == 1:  # on the pixel grid: read it, no interpolation
      dy, dx, _ = taps[0]
      out.append(grey[big + dy:big + dy + h, big + dx:big + dx + w])
      continue
    views = [img[big + dy:big + dy + h, big + dx:big + dx + w] for dy, dx, _ in taps]
    acc = views[0] * np.float32(taps[0][2])
    tmp = np.empty_like(acc)
    for view, (_, _, weight) in zip(views[1:], taps[1:]):
      acc += np.multiply(view, np.float32(weight), out=tmp)
    # Round half up, as std::round on these non-negative values: truncate v + 0.5.
    out.append((acc + np.float32(0.5)).astype(np.int16))
  return out


def _codes(samples, centre, threshold):
  """uint8 codes: bit p set where samples[p] > centre + threshold."""
  level = centre + np.int16(threshold)
  codes = np.zeros(centre.shape, np.uint8)
  bit = np.empty(centre.shape, np.uint8)
  for p, sample in enumerate(samples):
    np.left_shift(np.greater(sample, level).view(np.uint8), p, out=bit)
    codes |= bit
  return codes


def _valid_centres(mask, radius):
  """Interior pixels whose own pixel and every tap of their 8 samples lie in the mask."""
  big = math.ceil(radius)
  h, w = mask.shape[0] - 2 * big, mask.shape[1] - 2 * big
  if h <= 0 or w <= 0:
    return np.zeros((max(h, 0), max(w, 0)), bool)
  valid = mask[big:big + h, big:big + w].copy()
  for dy, dx in {(dy, dx) for taps in offsets(radius) for dy, dx, _ in taps}:
    valid &= mask[big + dy:big + dy + h, big + dx:big + dx + w]
  return valid


def _otsu_threshold(samples, centre, valid):
  """bilde's Otsu threshold on the histogram of |rounded sample - centre| (all neighbours).

  Estimated on every second row and column of the valid area: histogramming all 8 x ~10^5
  differences per radius would dominate the run time, and the threshold (an argmax over 256
  levels of a smooth function) hardly moves with a quarter of them.
  """
  half = (slice(None, None, 2),) * 2
  deltas = np.empty((len(samples),) + centre[half].shape, np.int16)
  for d, s in zip(deltas, samples):
    np.subtract(s[half], centre[half], out=d)
  np.abs(deltas, out=deltas)
  # Invalid pixels go to bins >= 256 and are dropped: cheaper than selecting the valid ones.
  deltas += np.int16(NUM_BINS) * ~valid[half]
  hist = np.bincount(deltas.ravel(), minlength=2 * NUM_BINS)[:NUM_BINS].astype(np.float64)
  return otsu(hist)


def otsu(hist):
  """bilde's Otsu threshold on a histogram of |sample - centre| (float64).

  The threshold maximising the between-class variance, the last one on ties; 0 when 99 % of
  the histogram lies below it.
  """
  hist = np.asarray(hist, np.float64)
  levels = np.arange(NUM_BINS, dtype=np.float64)
  total, mass = hist.sum(), (levels * hist).sum()
  w_back = np.cumsum(hist)
  w_fore = total - w_back
  s_back = np.cumsum(levels * hist)
  ok = (w_back > 0) & (w_fore > 0)
  if not ok.any():
    return 0
  with np.errstate(divide='ignore', invalid='ignore'):
    between = w_back * w_fore * (s_back / w_back - (mass - s_back) / w_fore) ** 2
  between = np.where(ok, between, -1.0)
  # bilde keeps the last threshold reaching the maximum (>=).
  t = int(np.flatnonzero(between == between.max())[-1])
  return 0 if hist[:t].sum() >= 0.99 * total else t
