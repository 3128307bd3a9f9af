"""SRS-LBP baseline (Sparse Radial Sampling LBP, Nicolaou et al., ICDAR 2015).

The HisFrag20 organisers' baseline, following their tools (bilde `lbpFeatures2 -r 1..12
-s bilinear -T otsu` and wi19 `srs_lbp.py`):

- For each radius r = 1..12: an 8-neighbour LBP code image. Neighbour p (bit p) is sampled at
  (x + r cos(2 pi p / 8), y + r sin(2 pi p / 8)) (y grows downwards) by bilinear interpolation
  rounded to the nearest grey level; the bit is set when that sample is brighter than the
  centre by more than a threshold T (one-tail comparison). T is picked per image and radius by
  Otsu's method on the histogram of |sample - centre| over all 8 neighbours of the valid
  pixels (below; every second row and column, for speed); as in bilde, T = 0 when 99 % of
  that histogram lies below the threshold.
- A 256-bin histogram of the codes over the valid fragment area: a pixel counts only if it and
  every pixel its 8 samples read lie inside the fragment mask (outside the fragment the image
  is black), so no code sees the black surround. The default mask is `fragment_mask`: grey
  above 8, holes filled.
- Bin 0 is zeroed, then the histogram is L1-normalised (bilde and wi19 suppress the bin before
  dividing, so each radius block sums to 1 with bin 0 at 0). A radius whose valid area is
  empty gives an all-zero block. The 12 blocks are concatenated: 3,072 values.
- Retrieval: PCA to 200 dims fitted on the training set (centred, not whitened) -> Hellinger
  (signed square root) -> L2 normalisation, compared with the L1 (cityblock) distance:
  `retrieval_metrics(embed(pca.fit(train_features, 200), f), labels, metric='cityblock')`.

Computed by jitted kernels over padded batches ([B, H, W], retrieval/features/buckets.py), on whatever
device JAX has, equal to the numpy code of retrieval/features/lbp_host.py (which a CPU-only host
runs instead, retrieval/features/patches.py): pass 1 histograms |sample - centre| on the device, the host picks each T from those
histograms in float64 (Otsu's argmax in float32 could pick another level), pass 2 histograms
the codes on the device, and the host normalises. The padding lies outside the mask, so it
never counts. `features` takes a list of images of any sizes; `features_padded` a batch the
caller has padded. On a CPU they take about 1.3x the reference's time.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from retrieval.features import buckets, decode, lbp_host, pca as pca_lib
from retrieval.features.lbp_host import NUM_BINS, RADII, fragment_mask

# On a CPU, batches of one 700 x 700 fragment took ~20 % less time a fragment than batches
# of 8 (measured on 2 cores; a batch's temporaries grow with it).
CPU_MAX_PIXELS = 2**20


def lbp_codes(gray, radius, threshold=0):
  """uint8 LBP codes of the pixels at least ceil(radius) away from the image border.

  Returns [H - 2R, W - 2R] with R = ceil(radius); code bit p is set when the bilinear sample
  of neighbour p, rounded, exceeds centre + threshold.
  """
  return np.asarray(_code_image(jnp.asarray(_grey(gray))[None], radius, threshold))[0]


def lbp_features(gray, mask=None, *, radii=RADII, threshold='otsu'):
  """SRS-LBP histograms of a grey uint8 image -> float32 [len(radii) * 256].

  `mask`: bool [H, W] fragment area; None derives it with `fragment_mask`. `threshold`:
  'otsu' (per image and radius, as the baseline) or a fixed integer.
  """
  return features([gray], None if mask is None else [mask], radii=radii,
                  threshold=threshold)[0]


def features(greys, masks=None, *, radii=RADII, threshold='otsu', max_pixels=None):
  """SRS-LBP histograms of grey uint8 images of any sizes -> float32 [N, len(radii) * 256].

  `masks`: bool fragment areas, one per image, or None for `fragment_mask` of each. Images
  are padded into shape buckets and batched (retrieval/features/buckets.py), so a few compilations
  serve any mix of sizes. `max_pixels`: of a padded batch; None: CPU_MAX_PIXELS on a CPU,
  buckets.MAX_PIXELS elsewhere.
  """
  greys = [_grey(g) for g in greys]
  masks = [fragment_mask(g) for g in greys] if masks is None else [np.asarray(m, bool)
                                                                   for m in masks]
  if len(masks) != len(greys):
    raise ValueError(f'{len(masks)} masks for {len(greys)} images')
  for g, m in zip(greys, masks):
    if m.shape != g.shape:
      raise ValueError(f'mask shape {m.shape} does not match image shape {g.shape}')
  out = np.zeros((len(greys), len(radii) * NUM_BINS), np.float32)
  if max_pixels is None:
    max_pixels = CPU_MAX_PIXELS if jax.default_backend() == 'cpu' else buckets.MAX_PIXELS
  for shape, indices, batch in buckets.groups([g.shape for g in greys], max_pixels):
    grey = buckets.pad([greys[i] for i in indices], shape, batch)
    mask = buckets.pad([masks[i] for i in indices], shape, batch, fill=False)
    out[indices] = features_padded(grey, mask, radii=radii, threshold=threshold)[:len(indices)]
  return out


def features_padded(grey, mask, *, radii=RADII, threshold='otsu'):
  """SRS-LBP histograms of a padded batch -> float32 np.ndarray [B, len(radii) * 256].

  `grey`: uint8 [B, H, W], `mask`: bool [B, H, W] (numpy or device arrays), each image at the
  top-left of its row and the padding outside its mask (rows of padding alone give zeros).
  Equal to `lbp_features` of each image unpadded: interior pixels are indexed from the same
  origin (R, R) as in the unpadded image, and a centre whose samples reach the padding is
  not valid.
  """
  if grey.ndim != 3 or grey.dtype != np.uint8 or mask.shape != grey.shape:
    raise ValueError(f'expected uint8 [B, H, W] and a bool mask of that shape, got '
                     f'{grey.dtype} {grey.shape} and {mask.shape}')
  radii = tuple(radii)
  if threshold == 'otsu':
    deltas = np.asarray(_delta_histograms(grey, mask, radii))
    thresholds = np.array([[lbp_host.otsu(h) for h in image] for image in deltas], np.int32)
  else:
    thresholds = np.full((grey.shape[0], len(radii)), int(threshold), np.int32)
  hist = np.asarray(_code_histograms(grey, mask, thresholds, radii)).astype(np.float64)
  hist[..., 0] = 0.0
  total = hist.sum(axis=-1, keepdims=True)
  hist = np.divide(hist, total, out=hist, where=total > 0)
  return hist.reshape(grey.shape[0], -1).astype(np.float32)


def features_of(read, indices, *, skip=()):
  """SRS-LBP features of read(i) (a picklable callable i -> RGB uint8 [H, W, 3]) for each of
  `indices`, in order, as arrays float32 [3072] (or the message of a file skipped for an
  exception of the types `skip`): each read once in worker processes, the features computed
  there on a CPU-only machine (lbp_host) and on the device otherwise."""
  indices = list(indices)
  names = [''] * len(indices)
  if not buckets.on_device():
    yield from decode.each(read, indices, names, decode.srs_lbp, skip=skip)
    return
  work = functools.partial(decode.prepare, lbp_mask=True)
  read = decode.each(read, indices, names, work, skip=skip)
  while window := list(itertools.islice(read, buckets.WINDOW)):
    usable = [p for p in window if not isinstance(p, str)]
    computed = iter(features([p.grey for p in usable], [p.lbp_mask for p in usable])
                    if usable else [])
    yield from (p if isinstance(p, str) else next(computed) for p in window)


def embed(pca, features):
  """Features [N, D] -> float32 [N, dim]: PCA (retrieval/features/pca.py, fitted on train features),
  Hellinger (signed sqrt), L2 normalisation."""
  y = pca_lib.project(pca, features)
  return pca_lib.l2_normalise(np.sign(y) * np.sqrt(np.abs(y)))


@functools.partial(jax.jit, static_argnames='radii')
def _delta_histograms(grey, mask, radii):
  """int32 [B, len(radii), 256]: per image and radius, the histogram of |sample - centre|
  (all 8 neighbours) over the valid centres on every second row and column of the interior.

  Otsu's threshold (an argmax over 256 levels of a smooth function) hardly moves with a
  quarter of the differences, and histogramming all of them would dominate the run time.
  """
  out = []
  for r in radii:
    centre = _interior(grey, r, step=2).astype(jnp.int16)[:, None]
    valid = _valid_centres(mask, r, step=2)[:, None]
    out.append(_histogram(jnp.abs(_samples(grey, r, step=2) - centre), valid))
  return jnp.stack(out, axis=1)


@functools.partial(jax.jit, static_argnames='radii')
def _code_histograms(grey, mask, thresholds, radii):
  """int32 [B, len(radii), 256]: per image and radius, the histogram of the codes over the
  valid centres, with int32 thresholds [B, len(radii)]."""
  out = []
  for k, r in enumerate(radii):
    level = _interior(grey, r).astype(jnp.int32) + thresholds[:, k, None, None]
    out.append(_histogram(_codes(_samples(grey, r), level), _valid_centres(mask, r)))
  return jnp.stack(out, axis=1)


@functools.partial(jax.jit, static_argnames='radius')
def _code_image(grey, radius, threshold):
  """uint8 codes [B, h, w] of the interior pixels at a fixed threshold."""
  level = _interior(grey, radius).astype(jnp.int32) + threshold
  return _codes(_samples(grey, radius), level).astype(jnp.uint8)


def _grey(gray):
  img = np.asarray(gray)
  if img.ndim != 2 or img.dtype != np.uint8:
    raise ValueError(f'expected a 2-D uint8 grey image, got {img.dtype} {img.shape}')
  return img


def _interior(x, radius, dy=0, dx=0, step=1):
  """x [B, H, W] read at offset (dy, dx) from each interior pixel: those at least
  R = ceil(radius) away from the border, every `step`-th row and column from (R, R)."""
  big = math.ceil(radius)
  h, w = max(x.shape[1] - 2 * big, 0), max(x.shape[2] - 2 * big, 0)
  top, left = big + dy, big + dx
  # A contiguous window of one of the step x step polyphase planes rather than a strided
  # window of the image: pass 1's samples computed 3x faster so on CPU.
  plane = x[:, top % step::step, left % step::step]
  rows, cols = (h + step - 1) // step, (w + step - 1) // step
  return plane[:, top // step:top // step + rows, left // step:left // step + cols]


def _samples(grey, radius, step=1):
  """int16 [B, 8, h, w]: the 8 neighbour samples of the interior pixels as grey levels, with
  the reference's float32 arithmetic (same taps, same order of multiply-adds). int16, not
  int32: with half the memory, pass 1 ran ~1.5x faster on CPU (4 fragments a batch)."""
  img = grey.astype(jnp.float32)
  out = []
  for taps in lbp_host.offsets(radius):
    if len(taps) == 1:  # on the pixel grid: read it, no interpolation
      dy, dx, _ = taps[0]
      out.append(_interior(grey, radius, dy, dx, step).astype(jnp.int16))
      continue
    acc = None
    for dy, dx, weight in taps:
      term = _times(_interior(img, radius, dy, dx, step), weight)
      acc = term if acc is None else acc + term
    # Round half up, as std::round on these non-negative values: truncate v + 0.5.
    out.append((acc + np.float32(0.5)).astype(jnp.int16))
  return jnp.stack(out, axis=1)


def _times(values, weight):
  """values (float32 grey levels) * float32(weight), rounded once, as numpy does.

  XLA fuses a multiply that feeds an add into one fused multiply-add, rounded once instead
  of twice: the sum differs in its last bit now and then, and so does a rounded sample. Split
  into two weights of 12 significant bits, both products of an 8-bit level are exact, so
  their sum is the product rounded once whether fused or not, and no inexact product is left
  to fuse into the accumulation.
  """
  weight = np.float32(weight)
  high = (weight.view(np.uint32) & np.uint32(0xFFFFF000)).view(np.float32)
  return values * high + values * (weight - high)


def _codes(samples, level):
  """int32 codes [B, h, w]: bit p set where samples[:, p] > level."""
  bits = (samples > level[:, None]).astype(jnp.int32) << jnp.arange(8).reshape(1, 8, 1, 1)
  return bits.sum(axis=1)


def _valid_centres(mask, radius, step=1):
  """Interior pixels whose own pixel and every tap of their 8 samples lie in the mask."""
  valid = _interior(mask, radius, step=step)
  for dy, dx in sorted({(dy, dx) for taps in lbp_host.offsets(radius) for dy, dx, _ in taps}):
    valid &= _interior(mask, radius, dy, dx, step)
  return valid


def _histogram(values, valid):
  """int32 [B, 256]: per image (axis 0), the counts of `values` [B, n, ...] (ints in
  [0, 256)) at the `valid` positions (broadcast against `values`).

  One scatter-add of pairs: the two halves of axis 1, side by side, count into a 257 x 257
  joint histogram (level 256: not valid, or the filler of an odd n), whose two marginals sum
  to the histogram. Half the updates and half the index array of counting values one by
  one; halves of an axis, not of the flattened array, keep the index arithmetic elementwise
  (halving the flattened values made pass 1 ~1.6x slower on CPU).
  """
  b = values.shape[0]
  values = jnp.where(valid, values, NUM_BINS).astype(jnp.int32)
  if values.shape[1] % 2:
    values = jnp.pad(values, [(0, 0), (0, 1)] + [(0, 0)] * (values.ndim - 2),
                     constant_values=NUM_BINS)
  half = values.shape[1] // 2
  side = NUM_BINS + 1
  first, second = values[:, :half], values[:, half:]
  image = jnp.arange(b).reshape((b,) + (1,) * (values.ndim - 1))
  ids = first * side + second + side * side * image
  # Pairs with nothing to count are dropped (out of range): counted into their one bin, they
  # made pass 1 twice as slow on CPU (the black surround is a large share of a fragment).
  ids = jnp.where((first == NUM_BINS) & (second == NUM_BINS), b * side * side, ids)
  joint = jax.ops.segment_sum(jnp.ones(ids.size, jnp.int32), ids.ravel(), b * side * side)
  joint = joint.reshape(b, side, side)
  return (joint.sum(axis=2) + joint.sum(axis=1))[:, :NUM_BINS]


