"""Shape buckets for batched per-fragment kernels, so that nothing compiles per image.

Fragments come in many sizes (HisFrag20: about 300 to 1,500 px a side). A jitted kernel
compiles once per input shape, so each image is zero-padded, top-left aligned, into a bucket:
each side rounded up to the next rung of a fixed geometric ladder (each rung at most 1.5x the
one below: a bucket of sides over 64 px holds under 2.25x its image's pixels, mostly far
fewer), and images of one bucket are batched together, the batch size rounded up to a power
of two. The kernels keep the padding out of every result by a mask (the fragment area, False
in the padding) or by each image's true size.
"""
import contextlib
import math

import jax
import numpy as np

LADDER = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
STEP_BEYOND = 2048  # past the ladder's top, sides round up to multiples of this
MAX_PIXELS = 2**24  # of a padded batch, by default


def bucket_shape(h, w):
  """(H, W): each side rounded up to the next rung of LADDER, then to a multiple of 2048."""
  return _rung(h), _rung(w)


def groups(shapes, max_pixels=MAX_PIXELS):
  """[((H, W), indices, batch)]: the images of `shapes` ([(h, w)]) grouped by bucket.

  Buckets come in the order of their first image, and a bucket's images in their order,
  cut into groups of at most `max(1, max_pixels // (H * W))` images, rounded down to a power
  of two so that the padded batch never exceeds `max_pixels` (unless one image does).
  `batch` is the group's image count rounded up to a power of two: the caller pads with
  empty images, so that a bucket compiles for a few batch sizes only.
  """
  members = {}  # dicts keep insertion order: buckets in order of first appearance
  for i, (h, w) in enumerate(shapes):
    members.setdefault(bucket_shape(h, w), []).append(i)
  out = []
  for (bh, bw), indices in members.items():
    cap = _floor_pow2(max(1, max_pixels // (bh * bw)))
    for start in range(0, len(indices), cap):
      chunk = indices[start:start + cap]
      out.append(((bh, bw), chunk, 1 << (len(chunk) - 1).bit_length()))
  return out


def pad(arrays, shape, batch, fill=0):
  """np.ndarray [batch, H, W]: each 2-D array at the top-left of its row, `fill` elsewhere
  (rows past len(arrays) hold only `fill`). dtype: the first array's."""
  if not 0 < len(arrays) <= batch:
    raise ValueError(f'{len(arrays)} arrays do not fit a batch of {batch}')
  out = np.full((batch,) + tuple(shape), fill, np.asarray(arrays[0]).dtype)
  for row, a in zip(out, arrays):
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[0] > shape[0] or a.shape[1] > shape[1]:
      raise ValueError(f'array of shape {a.shape} does not fit the bucket {tuple(shape)}')
    row[:a.shape[0], :a.shape[1]] = a
  return out


def _rung(n):
  if n < 1:
    raise ValueError(f'image side {n} is not positive')
  for rung in LADDER:
    if n <= rung:
      return rung
  return math.ceil(n / STEP_BEYOND) * STEP_BEYOND


def _floor_pow2(n):
  return 1 << (n.bit_length() - 1)


WINDOW = 64  # fragments grouped into buckets at a time: bounds what waits in memory


_forced = []


def on_device():
  """Whether the maps and SRS-LBP run on the device (an accelerator) or in the workers."""
  return bool(_forced) or jax.default_backend() != 'cpu'


@contextlib.contextmanager
def forced_device():
  """The device kernels even on a CPU: what tests and bench compare with the host's work."""
  _forced.append(True)
  try:
    yield
  finally:
    _forced.pop()
