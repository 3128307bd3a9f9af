"""The CPU depthwise convolution bengrapheme/models/efficientnet.py used before
bengrapheme/models/depthwise.py: k * k shifted slices times per-channel weights, under plain
autodiff, whose kernel gradient is k * k reductions, each over its own copy of one tap.
Kept as the reference bench/train_step.py times the new one against."""
import jax.numpy as jnp
from jax import lax


def conv(x, w, strides, padding):
  """NHWC x HWIO [kh, kw, 1, C], as lax.conv_general_dilated(..., feature_group_count=C)."""
  kh, kw = w.shape[:2]
  pads = (lax.padtype_to_pads(x.shape[1:3], (kh, kw), strides, padding)
          if isinstance(padding, str) else padding)
  out_h, out_w = [(n + lo + hi - k) // st + 1 for n, k, st, (lo, hi)
                  in zip(x.shape[1:3], (kh, kw), strides, pads)]
  x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  sh, sw = strides
  total = None  # accumulated in float32 at least, as the native convolution does
  for i in range(kh):
    for j in range(kw):
      tap = x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw]
      term = tap.astype(jnp.promote_types(x.dtype, jnp.float32)) * w[i, j, 0]
      total = term if total is None else total + term
  return total.astype(x.dtype)
