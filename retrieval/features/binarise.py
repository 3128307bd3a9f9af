"""Sauvola binarisation and box sums on the device, over padded batches.

`ink_mask_padded` is retrieval/features/patches.py's `ink_mask` (scikit-image 0.26
`threshold_sauvola(gray, window_size=25, k=0.2)`) for a batch: a pixel is ink when its grey
level is below

  T = m * (1 + k * (s / R - 1)),   R = 127.5 (half the uint8 range),

with m and s the mean and standard deviation of the window x window box centred on it, the
image extended past its border by reflection without repeating the edge pixel (numpy's
'reflect', as skimage pads). Each image of a padded batch (retrieval/features/buckets.py: top-left
aligned) is extended at its own border, not the bucket's, by gathering its rows and columns
through reflected indices, so padding changes no pixel.

Box sums come from int32 cumulative sums: exact even where a cumulative sum overflows, since
the wrapped (two's-complement) differences give back any box sum that fits in int32. The
variance is formed from those exact integer sums without cancellation (below), so T is within
a few float32 ulps of skimage's float64 value and the masks differ only on pixels whose grey
level lies within about 1e-4 of T.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from retrieval.features.decode import SAUVOLA_K, SAUVOLA_WINDOW  # the host's, which this equals

SAUVOLA_R = 127.5  # skimage's default: half the dtype's range, 0.5 * (255 - 0)


def ink_mask_padded(grey, area, sizes=None, *, window=SAUVOLA_WINDOW, k=SAUVOLA_K):
  """bool [B, H, W]: Sauvola ink (grey below its local threshold) inside `area`.

  grey: uint8 [B, H, W]; area: bool [B, H, W]; sizes: int [B, 2], each image's true (h, w)
  at the top-left of its row, or None when every image fills the array. Equal per image to
  `(gray < threshold_sauvola(gray, window, k)) & area` but for pixels whose grey level lies
  within float32 rounding of the threshold.
  """
  if grey.ndim != 3 or grey.dtype != np.uint8 or area.shape != grey.shape:
    raise ValueError(f'expected uint8 [B, H, W] and a bool area of that shape, got '
                     f'{grey.dtype} {grey.shape} and {area.shape}')
  if window < 1 or window % 2 == 0:
    raise ValueError(f'window must be a positive odd size, got {window}')
  if sizes is None:
    sizes = np.broadcast_to(np.array(grey.shape[1:]), (grey.shape[0], 2))
  return _ink_mask(grey, area, jnp.asarray(sizes, jnp.int32), window, float(k))


def box_sum_padded(mask, size):
  """int32 [B, H - size + 1, W - size + 1]: the sum of `mask` (bool or integer [B, H, W])
  over the size x size box whose top-left corner is at each pixel (as patches._box_sum)."""
  if not 1 <= size <= min(mask.shape[1:]):
    raise ValueError(f'box size {size} does not fit arrays of shape {mask.shape}')
  return _box_sum(mask, size)


@functools.partial(jax.jit, static_argnames='size')
def _box_sum(mask, size):
  table = jnp.cumsum(jnp.cumsum(mask.astype(jnp.int32), axis=1), axis=2)
  table = jnp.pad(table, ((0, 0), (1, 0), (1, 0)))
  return (table[:, size:, size:] - table[:, :-size, size:] - table[:, size:, :-size] +
          table[:, :-size, :-size])


@functools.partial(jax.jit, static_argnames=('window', 'k'))
def _ink_mask(grey, area, sizes, window, k):
  half = window // 2
  _, h, w = grey.shape
  rows = jax.vmap(_reflect, in_axes=(None, 0))(jnp.arange(-half, h + half), sizes[:, 0])
  cols = jax.vmap(_reflect, in_axes=(None, 0))(jnp.arange(-half, w + half), sizes[:, 1])
  # [B, H + window - 1, W + window - 1]: each image reflected at its own border.
  extended = jax.vmap(lambda g, r, c: g[r][:, c])(grey, rows, cols).astype(jnp.int32)
  mean, std = _mean_std(box_sum_padded(extended, window),
                        box_sum_padded(extended * extended, window), window * window)
  threshold = mean * (1 + k * (std / SAUVOLA_R - 1))
  return (grey < threshold) & area


def _reflect(index, n):
  """Indices into a side of length n, reflected past both ends without repeating the edge
  (numpy's 'reflect', which repeats with period 2n - 2 however far it reaches)."""
  period = jnp.maximum(2 * n - 2, 1)
  index = jnp.mod(index, period)
  return jnp.where(index >= n, period - index, index)


def _mean_std(total, squares, n):
  """float32 mean and standard deviation of n values from their int32 sum and sum of squares.

  n^2 var = n * squares - total^2 exceeds int32, and in float32 it would cancel. With
  total = n a + b (0 <= b < n), it is n e - b^2 where e = squares - n a^2 - 2 a b fits in
  int32 and is at most n var + b (~1e7 for uint8 and n = 625), so it is exact as a float32,
  and n e - b^2 is rounded once or twice, relative to itself: no cancellation.
  """
  a, b = total // n, total % n
  e = squares - n * a * a - 2 * a * b
  var = (n * e.astype(jnp.float32) - (b * b).astype(jnp.float32)) / (n * n)
  return total.astype(jnp.float32) / n, jnp.sqrt(jnp.maximum(var, 0))
