"""The host's part of the fragment features: each image read once, in worker processes.

A worker decodes a fragment (retrieval/fragments/reader.py, or retrieval/collections/collection.py for a scholar's
folder), finds the fragment's area and OpenCV's SIFT keypoints (detection only: no
descriptor is used). On an accelerator it hands the device the rest (`prepare`: the grey
image, the area, the keypoints and SRS-LBP's mask; retrieval/features/patches.py, retrieval/features/lbp.py);
on a CPU-only machine it does the rest itself (`extract`: Sauvola and the patch tests in
scikit-image and numpy, the draw, SRS-LBP in retrieval/features/lbp_host.py), which is faster there
than the kernels, compiles nothing, and sends back only the patches. Both give the same
patches. Workers run ahead of the consumer by a bounded number of fragments, so decoding
overlaps the device's work and memory stays bounded.

No jax here: the workers import this module, not the device code.
"""
import collections
import math
import os
import typing
import zlib

import cv2
import numpy as np
from PIL import Image, ImageChops
from skimage.filters import threshold_sauvola

from bengrapheme import console
from retrieval.features import lbp_host
from retrieval.fragments import reader

AHEAD = 128  # fragments decoded ahead of the consumer
SAUVOLA_WINDOW, SAUVOLA_K = 25, 0.2  # px: a few stroke widths at HisFrag20's resolution
INSIDE = 0.1  # at most this share of a patch may lie outside the fragment


class Prepared(typing.NamedTuple):
  """A fragment as the device's part reads it (retrieval/features/patches.py)."""
  grey: np.ndarray  # uint8 [H, W], as Pillow converts RGB to grey
  area: np.ndarray  # bool [H, W]: inside the fragment (some channel above BLACK_THRESHOLD)
  keypoints: np.ndarray  # int64 [n, 2]: (y, x) of SIFT's keypoints, rounded, in its order
  lbp_mask: np.ndarray | None  # bool [H, W]: SRS-LBP's fragment mask, when it is wanted


class Extracted(typing.NamedTuple):
  patches: np.ndarray  # uint8 [n, size, size], ink 255, n >= 1
  sift: np.ndarray | None  # uint8 [n, 128] when descriptors were asked for
  valid_pixels: int  # pixels inside the fragment
  lbp: np.ndarray | None  # float32 [3072] SRS-LBP features, when asked for


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
  """uint8 [max(H, size), max(W, size)] of bits, as retrieval/features/patches.py's device kernel
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


def grey_and_area(rgb):
  """(grey uint8, area bool) of RGB uint8 [H, W, 3], in Pillow's C loops (a numpy channel
  maximum took ~10x longer)."""
  image = Image.fromarray(rgb)
  r, g, b = image.split()
  area = np.asarray(ImageChops.lighter(ImageChops.lighter(r, g), b)) > reader.BLACK_THRESHOLD
  return np.asarray(image.convert('L')), area


def prepare(rgb, name, lbp_mask=False):
  """Prepared of RGB uint8 [H, W, 3], for the device (`name` unused: as `extract`)."""
  grey, area = grey_and_area(rgb)
  return Prepared(grey, area, keypoints(grey, area),
                  lbp_host.fragment_mask(grey) if lbp_mask else None)


def choose(maps, shape, found, name, *, size, max_patches, seed):
  """Top-left corners [(top, left)] of a fragment's patches (retrieval/features/patches.py's
  docstring) from its maps (`host_maps`'s bits) and keypoints `found`, with the draws the
  sampler has always made."""
  h, w = max(shape[0], size), max(shape[1], size)
  good = (maps[:h - size + 1, :w - size + 1] & 2) > 0
  ink = (maps & 1) > 0
  rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
  corners = {}  # top-left corner -> in keypoint order, one patch a location
  for y, x in found.tolist():
    top, left = y - size // 2, x - size // 2
    if 0 <= top <= h - size and 0 <= left <= w - size and ink[y, x] and good[top, left]:
      corners.setdefault((top, left), None)
  chosen = list(corners)
  if len(chosen) > max_patches:
    chosen = [chosen[i] for i in np.sort(rng.choice(len(chosen), max_patches, replace=False))]
  extra = []
  if len(chosen) < max_patches:  # top up from random ink pixels that make good patches
    tops, lefts = np.nonzero(good)
    picks = rng.permutation(len(tops))[:max_patches - len(chosen)]
    extra = [(int(tops[i]), int(lefts[i])) for i in picks
             if (tops[i], lefts[i]) not in corners]
  if not chosen and not extra:
    extra = [((h - size) // 2, (w - size) // 2)]
  return chosen + extra


def descriptors(grey, chosen, size):
  """uint8 [n, 128]: OpenCV's SIFT descriptor of each patch, at the patch's own scale."""
  cv2.setNumThreads(1)
  pad = ((0, max(0, size - grey.shape[0])), (0, max(0, size - grey.shape[1])))
  points = [cv2.KeyPoint(l + size / 2, t + size / 2, size / 2) for t, l in chosen]
  points, found = cv2.SIFT_create().compute(np.pad(grey, pad), points)
  if found is None or len(points) != len(chosen):  # OpenCV dropped a point at the border
    found = np.zeros((len(chosen), 128), np.float32)
  return np.clip(found, 0, 255).astype(np.uint8)


def cut(grey, found, maps, name, *, size, max_patches, seed, with_descriptors):
  """(patches uint8 [n, size, size] (ink 255), their SIFT descriptors or None)."""
  chosen = choose(maps, grey.shape, found, name, size=size, max_patches=max_patches, seed=seed)
  ink = maps & 1
  patches = np.stack([ink[t:t + size, l:l + size] for t, l in chosen]) * np.uint8(255)
  return patches, descriptors(grey, chosen, size) if with_descriptors else None


def extract(rgb, name, *, size, max_patches, ink_bounds, seed, with_lbp=False,
            with_descriptors=False):
  """Extracted of RGB uint8 [H, W, 3] computed here: what a worker of a CPU-only machine
  does, sending back only the patches."""
  grey, area = grey_and_area(rgb)
  maps = host_maps(grey, area, size, ink_bounds)
  patches, sift = cut(grey, keypoints(grey, area), maps, name, size=size,
                      max_patches=max_patches, seed=seed, with_descriptors=with_descriptors)
  features = lbp_host.lbp_features(grey) if with_lbp else None
  return Extracted(patches, sift, int(area.sum()), features)


def srs_lbp(rgb, name):
  """SRS-LBP features float32 [3072] of RGB uint8 [H, W, 3] computed here (`name` unused)."""
  return lbp_host.lbp_features(grey_and_area(rgb)[0])


def usable_cpus():
  """The CPUs this process may run on (affinity and cpusets; os.cpu_count ignores both)."""
  return len(os.sched_getaffinity(0))


_job = None  # (read, work, skip) of this worker


def _start(*job):
  global _job
  _job = job


def _one(i, name):
  read, work, skip = _job
  try:
    return work(read(i), name)
  except skip as e:
    return str(e)


def each(read, indices, names, work, *, skip=(), workers=None):
  """work(read(i), name) (or, for an exception of the types `skip`, its message) for each i
  of `indices` and its name, in order, in worker processes. read: a picklable callable i ->
  RGB uint8 [H, W, 3] and work one of `prepare`, `extract` (bound by functools.partial),
  `srs_lbp`: sent to each worker once. Other exceptions (a bad HisFrag20 file) propagate,
  naming the file."""
  indices = list(indices)
  job = (read, work, tuple(skip))
  workers = min(workers or usable_cpus(), max(1, len(indices)))
  if workers == 1 or len(indices) < 4:
    _start(*job)
    yield from map(_one, indices, names)
    return
  # forkserver, not fork: the caller runs JAX's threads, whose locks a fork would copy.
  with console.worker_pool(workers, 'forkserver', _start, job) as pool:
    pending = collections.deque()
    for i, name in zip(indices, names):
      pending.append(pool.apply_async(_one, (i, name)))
      if len(pending) >= AHEAD:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()
