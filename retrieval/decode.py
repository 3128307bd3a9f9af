"""The host's part of the fragment features: each image read once, in worker processes.

A worker decodes a fragment (retrieval/reader.py, or retrieval/collection.py for a scholar's
folder) and hands the device what it reads (`Prepared`): the grey image, the fragment's area
and, for SRS-LBP, its mask with holes filled. Everything after that runs on the device
(retrieval/patches.py, retrieval/lbp.py). The workers run ahead of the device by a bounded
number of fragments, so decoding overlaps the device's work and memory stays bounded.

No jax here: the workers import this module, not the device code.
"""
import collections
import os
import typing

import numpy as np
from PIL import Image, ImageChops
from scipy import ndimage

from bengrapheme import console
from retrieval import reader

AHEAD = 128  # fragments decoded ahead of the consumer


class Prepared(typing.NamedTuple):
  """A fragment as the device reads it."""
  grey: np.ndarray  # uint8 [H, W], as Pillow converts RGB to grey
  area: np.ndarray  # bool [H, W]: inside the fragment (some channel above BLACK_THRESHOLD)
  lbp_mask: np.ndarray | None  # bool [H, W]: SRS-LBP's fragment mask, when it is wanted


def fragment_mask(grey, black_level=8):
  """SRS-LBP's fragment area: grey above `black_level` (JPEG noise in the black surround),
  holes filled (dark ink strokes stay inside the fragment)."""
  return ndimage.binary_fill_holes(np.asarray(grey) > black_level)


def prepare(rgb, lbp_mask=False):
  """Prepared of RGB uint8 [H, W, 3]; the grey and the brightest channel in Pillow's C loops
  (a numpy channel maximum took ~10x longer)."""
  image = Image.fromarray(rgb)
  grey = np.asarray(image.convert('L'))
  r, g, b = image.split()
  area = np.asarray(ImageChops.lighter(ImageChops.lighter(r, g), b)) > reader.BLACK_THRESHOLD
  return Prepared(grey, area, fragment_mask(grey) if lbp_mask else None)


def usable_cpus():
  """The CPUs this process may run on (affinity and cpusets; os.cpu_count ignores both)."""
  return len(os.sched_getaffinity(0))


_read, _lbp_mask, _skip = None, False, ()


def _start(read, lbp_mask, skip):
  global _read, _lbp_mask, _skip
  _read, _lbp_mask, _skip = read, lbp_mask, skip


def _one(i):
  try:
    return prepare(_read(i), _lbp_mask)
  except _skip as e:
    return str(e)


def prepared(read, indices, *, lbp_mask=False, skip=(), workers=None):
  """Prepared (or, for an exception of the types `skip`, its message) of read(i) for each of
  `indices`, in order; read: a picklable callable i -> RGB uint8 [H, W, 3], sent to each
  worker once. Other exceptions (a bad HisFrag20 file) propagate, naming the file."""
  indices = list(indices)
  workers = min(workers or usable_cpus(), max(1, len(indices)))
  if workers == 1 or len(indices) < 4:
    _start(read, lbp_mask, tuple(skip))
    yield from map(_one, indices)
    return
  # forkserver, not fork: the caller runs JAX's threads, whose locks a fork would copy.
  with console.worker_pool(workers, 'forkserver', _start, (read, lbp_mask, tuple(skip))) as pool:
    pending = collections.deque()
    for i in indices:
      pending.append(pool.apply_async(_one, (i,)))
      if len(pending) >= AHEAD:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()
