"""Difference-of-Gaussians keypoints on the device: where the patch extractor centres patches.

SIFT's detector (Lowe 2004, as OpenCV runs it) without its descriptor and without its
host-side C++ pass, for a padded batch of fragments at once:

  - a Gaussian scale space at the fragment's own resolution, sigma 0.8 * 2^(i/3) px for
    i = 0 .. LEVELS - 1 (the image taken as blurred by 0.5 px, as SIFT assumes). SIFT
    doubles the image first and starts at 1.6 px of the doubled image: the same 0.8 px of
    the native one, where nearly all of its keypoints on handwriting are found (its octave
    -1 held 75-85 % of them on the synthetic fragments; its octave 0 begins at 1.6 px,
    which the upper levels here cover);
  - the differences of consecutive levels, and a keypoint wherever a difference is the
    largest or smallest of its 3 x 3 x 3 neighbourhood (ties included, as OpenCV's >=),
    with |D| above CONTRAST (OpenCV's 0.04 / 3 of the grey range) and a principal-curvature
    ratio below EDGE_RATIO (OpenCV's edge test: strokes' long edges are dropped).

No sub-pixel refinement: the extractor rounds a keypoint to a pixel anyway, so OpenCV's
refined positions differ from these by at most a pixel. Each blur is separable and written as
shifted, weighted slices, which XLA fuses into one pass over the image on a CPU as on an
accelerator (a 1-channel convolution ran ~5x slower on the CPU).
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

LEVELS = 8  # Gaussian levels; extrema are found in the differences 1 .. LEVELS - 3
BASE_SIGMA, ASSUMED_BLUR = 0.8, 0.5
CONTRAST = 0.04 / 3 * 255  # OpenCV's contrastThreshold / nOctaveLayers, grey levels 0-255
EDGE_RATIO = 10.0


def _taps(sigma):
  radius = max(1, math.ceil(3 * sigma))
  x = np.arange(-radius, radius + 1)
  g = np.exp(-x ** 2 / (2 * sigma ** 2))
  return (g / g.sum()).tolist()


def _blur_axis(x, sigma, axis):
  taps = _taps(sigma)
  r = len(taps) // 2
  n = x.shape[axis]
  pad = [(0, 0)] * x.ndim
  pad[axis] = (r, r)
  p = jnp.pad(x, pad, mode='edge')
  out = taps[0] * jax.lax.slice_in_dim(p, 0, n, axis=axis)
  for k in range(1, len(taps)):
    out = out + taps[k] * jax.lax.slice_in_dim(p, k, k + n, axis=axis)
  return out


def _blur(x, sigma):
  return _blur_axis(_blur_axis(x, sigma, 1), sigma, 2)


def _neighbourhood(d, reduce):
  """reduce over the 3 x 3 x 3 neighbourhood of d [B, L, H, W], for levels 1 .. L - 2."""
  a = reduce(reduce(d[:, :-2], d[:, 1:-1]), d[:, 2:])
  for axis in (2, 3):
    pad = [(0, 0)] * 4
    pad[axis] = (1, 1)
    p = jnp.pad(a, pad, mode='edge')
    n = a.shape[axis]
    a = reduce(reduce(jax.lax.slice_in_dim(p, 0, n, axis=axis),
                      jax.lax.slice_in_dim(p, 1, n + 1, axis=axis)),
               jax.lax.slice_in_dim(p, 2, n + 2, axis=axis))
  return a


def _shift(x, dy, dx):
  """x moved so that out[y, x] = in[y + dy, x + dx], edges repeated."""
  p = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode='edge')
  h, w = x.shape[2:]
  return p[:, :, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w]


@jax.jit
def detect(grey):
  """bool [B, H, W]: the pixels of grey [B, H, W] (uint8) holding a keypoint at any scale."""
  image = grey.astype(jnp.float32)
  sigmas = [BASE_SIGMA * 2 ** (i / 3) for i in range(LEVELS)]
  levels = [_blur(image, math.sqrt(sigmas[0] ** 2 - ASSUMED_BLUR ** 2))]
  for before, sigma in zip(sigmas, sigmas[1:]):  # each level from the one before it
    levels.append(_blur(levels[-1], math.sqrt(sigma ** 2 - before ** 2)))
  d = jnp.stack([b - a for a, b in zip(levels, levels[1:])], axis=1)  # [B, L - 1, H, W]
  inner = d[:, 1:-1]
  extremum = ((inner >= _neighbourhood(d, jnp.maximum)) |
              (inner <= _neighbourhood(d, jnp.minimum))) & (jnp.abs(inner) > CONTRAST)
  dxx = _shift(inner, 0, 1) + _shift(inner, 0, -1) - 2 * inner
  dyy = _shift(inner, 1, 0) + _shift(inner, -1, 0) - 2 * inner
  dxy = (_shift(inner, 1, 1) - _shift(inner, 1, -1) - _shift(inner, -1, 1) +
         _shift(inner, -1, -1)) / 4
  trace, det = dxx + dyy, dxx * dyy - dxy ** 2
  # Lowe's edge test: tr^2 / det < (r + 1)^2 / r, and a saddle (det <= 0) is no keypoint.
  corner = (det > 0) & (trace ** 2 * EDGE_RATIO < (EDGE_RATIO + 1) ** 2 * det)
  return jnp.any(extremum & corner, axis=1)
