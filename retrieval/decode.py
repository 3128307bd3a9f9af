"""The host's part of the fragment features: each image read once, in worker processes.

A worker decodes a fragment (retrieval/reader.py, or retrieval/collection.py for a scholar's
folder) and prepares what the patch sampler and SRS-LBP read (`Prepared`): the grey image,
the fragment's area, OpenCV's SIFT keypoints (detection only: no descriptor is used) and,
for SRS-LBP, its mask with holes filled. On an accelerator the rest runs on the device
(retrieval/patches.py, retrieval/lbp.py); on a CPU-only machine the worker computes it too,
in numpy and scikit-image (`host_maps`, retrieval/lbp_host.py), which are faster there than
the kernels and compile nothing. Workers run ahead of the consumer by a bounded number of
fragments, so decoding overlaps the device's work and memory stays bounded.

No jax here: the workers import this module, not the device code.
"""
import collections
import math
import os
import typing

import cv2
import numpy as np
from PIL import Image, ImageChops
from skimage.filters import threshold_sauvola

from bengrapheme import console
from retrieval import lbp_host, reader

AHEAD = 128  # fragments decoded ahead of the consumer
SAUVOLA_WINDOW, SAUVOLA_K = 25, 0.2  # px: a few stroke widths at HisFrag20's resolution
INSIDE = 0.1  # at most this share of a patch may lie outside the fragment


class Prepared(typing.NamedTuple):
  """A fragment as the patch sampler and SRS-LBP read it."""
  grey: np.ndarray  # uint8 [H, W], as Pillow converts RGB to grey
  area: np.ndarray  # bool [H, W]: inside the fragment (some channel above BLACK_THRESHOLD)
  keypoints: np.ndarray | None  # int64 [n, 2]: (y, x) of SIFT's keypoints, rounded, in its
  # order (None when only SRS-LBP is wanted)
  lbp_mask: np.ndarray | None  # bool [H, W]: SRS-LBP's fragment mask, when it is wanted
  maps: np.ndarray | None  # uint8: `host_maps`, when the host computes them
  lbp: np.ndarray | None  # float32 [3072]: SRS-LBP features, when the host computes them


def keypoints(grey, area):
  """(y, x) int64 [n, 2] of OpenCV's SIFT keypoints on the fragment's area, rounded to
  pixels, in OpenCV's order (Christlein et al. 2017's sampling)."""
  cv2.setNumThreads(1)  # one thread a worker: the pool is the parallelism
  found = cv2.SIFT_create().detect(grey, area.astype(np.uint8))
  return np.array([(int(round(k.pt[1])), int(round(k.pt[0]))) for k in found],
                  np.int64).reshape(-1, 2)


def count_limits(size, ink_bounds):
  """Integer limits of a patch's ink pixels (low, high) and outside pixels, equal to the
  share tests in float64 (ink_bounds[0] <= ink / size^2 <= ink_bounds[1], outside <= 10 %)."""
  cells = size * size
  low = next(c for c in range(cells + 1) if c / cells >= ink_bounds[0])
  high = max(c for c in range(cells + 1) if c / cells <= ink_bounds[1])
  return low, high, math.floor(INSIDE * cells)


def _box_sum(mask, size):
  """Sum of `mask` over the size x size box whose top-left corner is at each pixel."""
  table = np.pad(mask.astype(np.int32).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
  return (table[size:, size:] - table[:-size, size:] - table[size:, :-size] +
          table[:-size, :-size])


def host_maps(grey, area, size, ink_bounds):
  """uint8 [max(H, size), max(W, size)] of bits, as retrieval/patches.py's device kernel
  makes them: 1 ink at the pixel (Sauvola inside the area); 2 a good patch has its top-left
  corner at the pixel (inside the fragment, ink share within bounds, ink at its centre). A
  fragment smaller than a patch is padded with background to one."""
  ink = (grey < threshold_sauvola(grey, window_size=SAUVOLA_WINDOW, k=SAUVOLA_K)) & area
  h, w = grey.shape
  pad = ((0, max(0, size - h)), (0, max(0, size - w)))
  area, ink = np.pad(area, pad), np.pad(ink, pad)
  low, high, outside = count_limits(size, ink_bounds)
  count = _box_sum(ink, size)
  good = (_box_sum(~area, size) <= outside) & (count >= low) & (count <= high)
  gh, gw = good.shape
  good &= ink[size // 2:size // 2 + gh, size // 2:size // 2 + gw]
  maps = ink.astype(np.uint8)
  maps[:gh, :gw] |= good.astype(np.uint8) << 1
  return maps


def prepare(rgb, lbp_mask=False, host=None):
  """Prepared of RGB uint8 [H, W, 3]; the grey and the brightest channel in Pillow's C loops
  (a numpy channel maximum took ~10x longer). host: computed here too: dict(size,
  ink_bounds) the maps, and with lbp_mask the SRS-LBP features; dict() the features alone
  (no keypoints then: only SRS-LBP is wanted)."""
  image = Image.fromarray(rgb)
  grey = np.asarray(image.convert('L'))
  r, g, b = image.split()
  area = np.asarray(ImageChops.lighter(ImageChops.lighter(r, g), b)) > reader.BLACK_THRESHOLD
  mask = lbp_host.fragment_mask(grey) if lbp_mask else None
  maps = features = None
  if host is not None and lbp_mask:
    features = lbp_host.lbp_features(grey, mask)
  if host is not None and 'size' in host:
    maps = host_maps(grey, area, host['size'], host['ink_bounds'])
  found = keypoints(grey, area) if host is None or 'size' in host else None
  return Prepared(grey, area, found, mask, maps, features)


def usable_cpus():
  """The CPUs this process may run on (affinity and cpusets; os.cpu_count ignores both)."""
  return len(os.sched_getaffinity(0))


_job = None  # (read, lbp_mask, host, skip) of this worker


def _start(*job):
  global _job
  _job = job


def _one(i):
  read, lbp_mask, host, skip = _job
  try:
    return prepare(read(i), lbp_mask, host)
  except skip as e:
    return str(e)


def prepared(read, indices, *, lbp_mask=False, host=None, skip=(), workers=None):
  """Prepared (or, for an exception of the types `skip`, its message) of read(i) for each of
  `indices`, in order; read: a picklable callable i -> RGB uint8 [H, W, 3], sent to each
  worker once; host: as `prepare`'s. Other exceptions (a bad HisFrag20 file) propagate,
  naming the file."""
  indices = list(indices)
  job = (read, lbp_mask, host, tuple(skip))
  workers = min(workers or usable_cpus(), max(1, len(indices)))
  if workers == 1 or len(indices) < 4:
    _start(*job)
    yield from map(_one, indices)
    return
  # forkserver, not fork: the caller runs JAX's threads, whose locks a fork would copy.
  with console.worker_pool(workers, 'forkserver', _start, job) as pool:
    pending = collections.deque()
    for i in indices:
      pending.append(pool.apply_async(_one, (i,)))
      if len(pending) >= AHEAD:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()
