"""Depthwise convolution (one group per channel; NHWC input, HWIO kernel [kh, kw, 1, C]) as
elementwise loops, for XLA's CPU backend, which runs grouped convolutions slowly (seconds for
the forward and backward of one of EfficientNet-B0's layers at 128x128, batch 64).

The forward and each gradient are one fused loop over a padded copy of their input:
- the output sums k * k shifted slices of the input times per-channel weights;
- the input gradient is the convolution's transpose, one stride phase of the input at a time
  (_phases), each a stride-1 shifted sum over the output gradient, so that no zeros go
  between the gradient's rows as a strided transpose would put them;
- the kernel gradient, which plain autodiff takes as k * k reductions, each over its own copy
  of one tap of the input, adds up every output position's k x k input window times the
  gradient there, over blocks of positions (_kernel_grad); a small reduction over batch and
  blocks follows.
The backward pass keeps the padded input the forward made.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax

# Output positions a side whose windows the kernel-gradient loop adds up in one block (or a
# multiple, for kernels wider than BLOCK strides): 4 and 8 ran B0's layers as fast, 4 compiles
# in less time, 12 or 16 made the loop several times slower.
BLOCK = 4


def conv(x, w, strides, padding):
  """lax.conv_general_dilated(x, w, strides, padding, feature_group_count=C) for NHWC x HWIO;
  padding is 'SAME', 'VALID' or ((top, bottom), (left, right))."""
  kernel, strides = w.shape[:2], tuple(strides)
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(x.shape[1:3], kernel, strides, padding)
  out_size = tuple((n + lo + hi - k) // s + 1
                   for n, k, s, (lo, hi) in zip(x.shape[1:3], kernel, strides, padding))
  # Padded on to the rows and columns the kernel gradient's blocks span (which cover the
  # convolution's), so that the backward pass can keep the padded input.
  padding = tuple((lo, _blocks(out, k, s)[0] - lo - n) for n, k, s, (lo, _), out
                  in zip(x.shape[1:3], kernel, strides, padding, out_size))
  return _conv(x, w, strides, padding, out_size)


def _blocks(n, k, s):
  """For n output positions of a k-tap, stride-s dimension: (input rows the blocks span,
  positions a block, blocks, input rows a block), for _kernel_grad."""
  # Blocks of m positions, m a multiple of BLOCK with m * s >= k (if there are several).
  m = min(n, BLOCK * -(-k // (s * BLOCK)))
  blocks = -(-n // m)
  step = m * s if blocks > 1 else k
  return (m - 1) * s + blocks * step, m, blocks, step


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv(x, w, strides, padding, out_size):
  """The first out_size outputs of the depthwise convolution of x padded by `padding`."""
  return _conv_fwd(x, w, strides, padding, out_size)[0]


def _conv_fwd(x, w, strides, padding, out_size):
  padded = lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), *[(*p, 0) for p in padding],
                                                (0, 0, 0)))
  return _shifted(padded, w, strides, out_size), (padded, w)


def _conv_bwd(strides, padding, out_size, residuals, dy):
  padded, w = residuals
  size = [n - lo - hi for n, (lo, hi) in zip(padded.shape[1:3], padding)]
  return (_input_grad(dy, w, strides, padding, size),
          _kernel_grad(padded, dy, w.shape[:2], strides).astype(w.dtype))


_conv.defvjp(_conv_fwd, _conv_bwd)


def _shifted(x, w, strides, out_size):
  """The first out_size outputs of the unpadded (VALID) depthwise convolution."""
  (sh, sw), (out_h, out_w) = strides, out_size
  acc = jnp.promote_types(x.dtype, jnp.float32)  # as the native convolution accumulates
  total = jnp.zeros((x.shape[0], out_h, out_w, x.shape[3]), acc)
  for i in range(w.shape[0]):
    for j in range(w.shape[1]):
      tap = x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw]
      total = total + tap.astype(acc) * w[i, j, 0].astype(acc)
  return total.astype(x.dtype)


def _input_grad(dy, w, strides, padding, size):
  """dx[b, n, m, c] = sum of dy[b, h, w, c] * w[i, j, c] over h * sh + i = n + top and
  w * sw + j = m + left, for n, m < size: the convolution's transpose, a phase at a time
  (_phases), the phases then interleaved."""
  (sh, sw), (height, width) = strides, size
  batch, _, _, channels = dy.shape
  (front_h, back_h, rows), (front_w, back_w, cols) = [
      _phases(n, k, s, lo, out)
      for n, k, s, (lo, _), out in zip(size, w.shape[:2], strides, padding, dy.shape[1:3])]
  dy = lax.pad(dy, jnp.zeros((), dy.dtype),
               ((0, 0, 0), (front_h, back_h, 0), (front_w, back_w, 0), (0, 0, 0)))
  n_h, n_w = -(-height // sh), -(-width // sw)  # inputs a phase, rounded up
  phases = [jnp.stack([_shifted(dy[:, start_h:, start_w:], w[tap_h::sh, tap_w::sw, :][::-1, ::-1],
                                (1, 1), (n_h, n_w))
                       for tap_w, start_w in cols], axis=3)
            for tap_h, start_h in rows]
  dx = jnp.stack(phases, axis=2).reshape(batch, n_h * sh, n_w * sw, channels)
  return dx[:, :height, :width]


def _phases(n, k, s, lo, out):
  """One dimension of the input gradient, n inputs behind `lo` padding, `out` outputs.

  Input N * s + p (phase p < s) takes the taps first + s * t, first = (p + lo) % s:
  dx[N * s + p] = sum over t of dy[N + (p + lo) // s - t] * w[first + s * t], a stride-1
  convolution of dy with those taps flipped, dy shifted. Returns dy's padding (front, back)
  and, per phase, (first, where its shifted dy starts), so that no zeros go between dy's
  rows as a strided transpose would put them.
  """
  firsts = [(p + lo) % s for p in range(s)]
  fronts = [len(range(first, k, s)) - 1 - (p + lo) // s for p, first in enumerate(firsts)]
  front = max(fronts)
  back = -(-n // s) + (s - 1 + lo) // s - out
  return front, back, [(first, front - f) for first, f in zip(firsts, fronts)]


def _kernel_grad(x, dy, kernel, strides):
  """dw[i, j, c] = sum over b, h, w of x[b, h * sh + i, w * sw + j, c] * dy[b, h, w, c], x
  padded to _blocks' span.

  Output positions go in blocks of m x m (dy padded with zeros to whole blocks). Position
  (r, q) of every block has its window at the same offset in its block's input rows and
  columns (a block's step: m * s >= k, or the whole map), so one slice and a reshape give
  all those windows; the loop over (r, q) sums them times dy into
  [B, blocks, kh, blocks, kw, C].
  """
  batch, out_h, out_w, channels = dy.shape
  (kh, kw), (sh, sw) = kernel, strides
  (_, mh, bh, step_h), (_, mw, bw, step_w) = [_blocks(n, k, s) for n, k, s
                                              in zip((out_h, out_w), kernel, strides)]
  acc = jnp.promote_types(x.dtype, jnp.float32)
  x = x.astype(acc)
  dy = jnp.pad(dy.astype(acc), ((0, 0), (0, bh * mh - out_h), (0, bw * mw - out_w), (0, 0)))
  total = 0
  for r in range(mh):
    for q in range(mw):
      windows = x[:, r * sh:r * sh + bh * step_h, q * sw:q * sw + bw * step_w]
      windows = windows.reshape(batch, bh, step_h, bw, step_w, channels)[:, :, :kh, :, :kw]
      total = total + windows * dy[:, r::mh, None, q::mw, None]
  # Reversed (a no-op for the sum) so that XLA:CPU's YNNPACK reduction does not take in the
  # products, which would copy out every window first; the reversal fuses into the loop.
  return total[::-1].sum((0, 1, 3))[:, :, None]
