"""The host fragment pipeline, kept verbatim as the reference that the device kernels
(retrieval/features/patches.py, binarise.py, keypoints.py, lbp.py) and their pipeline are
timed and compared against (bench/fragment_features.py, tests):

- `extract`: the patch extractor: scikit-image's Sauvola in float64, OpenCV SIFT detection
  and description on the host, one fragment at a time;
- `lbp_sample_pca`, `embed`: retrieval/collections/index.py's embedding of a collection: each image read
  in a thread pool sized by os.cpu_count(), cut by `extract`, decoded again for SRS-LBP, a
  chunk extracted, then embedded, in turns.

Only the imports differ: retrieval modules this code called now have device versions, so it
calls the numpy SRS-LBP where it now lives (retrieval/features/lbp_host.py, unchanged) and `extract` here.
"""
import collections
import concurrent.futures
import os
import zlib

import cv2
import numpy as np
from skimage.filters import threshold_sauvola


from bengrapheme import console, errors, inference
from retrieval.features import aggregate, lbp, lbp_host, pca
from retrieval.collections import collection
from retrieval.fragments import evaluate, reader
from retrieval.collections.index import CHUNK, Entries, _Patches

SAUVOLA_WINDOW = 25  # px: a few stroke widths at HisFrag20's resolution


def ink_mask(gray, area):
  """bool [H, W]: dark strokes (Sauvola) inside the fragment `area`."""
  threshold = threshold_sauvola(gray, window_size=SAUVOLA_WINDOW, k=0.2)
  return (gray < threshold) & area


def _box_sum(mask, size):
  """Sum of `mask` over the size x size box whose top-left corner is at each pixel."""
  table = np.pad(mask.astype(np.int32).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
  return (table[size:, size:] - table[:-size, size:] - table[size:, :-size] +
          table[:-size, :-size])


def extract(rgb, name, *, size, max_patches, ink_bounds, seed):
  """(patches uint8 [n, size, size] (ink 255), sift uint8 [n, 128]) of one fragment, n >= 1."""
  gray = np.asarray(reader.convert(rgb, color=False))
  area = rgb.max(axis=-1) > reader.BLACK_THRESHOLD
  ink = ink_mask(gray, area)
  h, w = gray.shape
  if h < size or w < size:  # smaller than one patch: pad with background
    pad = ((0, max(0, size - h)), (0, max(0, size - w)))
    gray, area, ink = np.pad(gray, pad), np.pad(area, pad), np.pad(ink, pad)
    h, w = gray.shape
  ink_share = _box_sum(ink, size) / size**2  # [h - size + 1, w - size + 1], by top-left
  inside = _box_sum(~area, size) <= 0.1 * size**2
  good = inside & (ink_share >= ink_bounds[0]) & (ink_share <= ink_bounds[1])

  sift = cv2.SIFT_create()
  # Detection and description share one scale-space pyramid; SIFT is ~70 % of the time.
  keypoints, descriptors = sift.detectAndCompute(gray, area.astype(np.uint8))
  rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
  corners = {}  # top-left corner -> the first keypoint's descriptor (one patch a location)
  for kp, descriptor in zip(keypoints, descriptors if descriptors is not None else []):
    x, y = int(round(kp.pt[0])), int(round(kp.pt[1]))
    top, left = y - size // 2, x - size // 2
    if (0 <= top <= h - size and 0 <= left <= w - size and ink[y, x] and good[top, left]):
      corners.setdefault((top, left), descriptor)
  chosen = list(corners)
  if len(chosen) > max_patches:
    chosen = [chosen[i] for i in np.sort(rng.choice(len(chosen), max_patches, replace=False))]
  found = [corners[c] for c in chosen]
  extra = []
  if len(chosen) < max_patches:  # top up from random ink pixels that make good patches
    tops, lefts = np.nonzero(good & ink[size // 2:h - size + 1 + size // 2,
                                        size // 2:w - size + 1 + size // 2])
    picks = rng.permutation(len(tops))[:max_patches - len(chosen)]
    extra = [(int(tops[i]), int(lefts[i])) for i in picks
             if (tops[i], lefts[i]) not in corners]
  if not chosen and not extra:
    extra = [((h - size) // 2, (w - size) // 2)]
  if extra:  # described at the patch's own scale
    points = [cv2.KeyPoint(l + size / 2, t + size / 2, size / 2) for t, l in extra]
    points, more = sift.compute(gray, points)
    if more is None or len(points) != len(extra):  # OpenCV dropped a point at the border
      more = np.zeros((len(extra), 128), np.float32)
    found += list(more)
    chosen += extra
  patches = np.stack([ink[t:t + size, l:l + size] for t, l in chosen]).astype(np.uint8) * 255
  return patches, np.clip(np.stack(found), 0, 255).astype(np.uint8)


def lbp_sample_pca(config, paths, seed):
  """(the SRS-LBP PCA (as the evaluator's, 200 dims) fitted on up to eval.lbp_fit_fragments
  images drawn from `paths` (absolute), {path: their SRS-LBP features}); images that cannot
  be read are left to the main pass to report."""
  order = np.random.default_rng(seed).permutation(len(paths))[:config.eval.lbp_fit_fragments]

  def one(i):
    try:
      return lbp_host.lbp_features(reader.convert(collection.read_fragment(paths[i]),
                                                  color=False))
    except collection.Unreadable:
      return None

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool, \
      console.Progress(len(order), 'SRS-LBP features for its PCA', unit='image') as progress:
    found = {}
    for i, x in zip(order, pool.map(one, order)):
      if x is not None:
        found[paths[i]] = x
      progress.update()
  if len(found) < 2:
    raise errors.UserError('SRS-LBP fusion needs at least 2 readable images to fit its PCA')
  features = np.stack(list(found.values()))
  return pca.fit(features, min(200, len(features) - 1, features.shape[1])), found


def embed(config, model, settings, lbp_pca, jobs, on_chunk, progress=None, lbp_known=None):
  """Embeds the images `jobs` [(path, name seeding its patches)] in chunks of CHUNK:
  on_chunk(rows, entries, problems) gets, for each chunk in order, the rows of `jobs` it
  embedded, their Entries (paths as given; sizes and times left 0) and a message for each
  image that could not be read. lbp_known: {path: SRS-LBP features} computed already."""
  lbp_known = lbp_known or {}
  fuse = settings['fusion_weight'] > 0
  i = config.input

  def one(job):
    path, name = job
    try:
      rgb = collection.read_fragment(path)
    except collection.Unreadable as e:
      return None, None, str(e)
    cut, _ = extract(rgb, name, size=i.patch_size, max_patches=i.max_patches,
                             ink_bounds=i.ink_bounds, seed=config.seed)
    features = None
    if fuse:
      features = lbp_known.pop(path, None)
      if features is None:
        features = lbp_host.lbp_features(reader.convert(rgb, color=False))
    return cut, features, None

  pending = collections.deque()

  def finish(start, results, embeddings):
    ok = [r for r, (cut, _, _) in enumerate(results) if cut is not None]
    counts = [len(results[r][0]) for r in ok]
    if ok:
      pooled = aggregate.sum_pool(embeddings, np.concatenate([[0], np.cumsum(counts)]))
      descriptors = aggregate.power_l2(pooled, settings['power'])
    else:
      descriptors = np.zeros((0, config.model.embedding_dim), np.float32)
    lbp_rows = (lbp.embed(lbp_pca, np.stack([results[r][1] for r in ok])) if fuse and ok
                else np.zeros((len(ok), lbp_pca.components.shape[0] if fuse else 0),
                              np.float32))
    names = np.array([jobs[start + r][0] for r in ok], str)
    entries = Entries(names, np.zeros(len(ok), np.int64), np.zeros(len(ok), np.int64),
                      descriptors.astype(np.float32), lbp_rows.astype(np.float32))
    on_chunk([start + r for r in ok], entries, [m for _, _, m in results if m])
    if progress is not None:
      progress.update(len(results))

  def sources(pool):
    for start in range(0, len(jobs), CHUNK):
      results = list(pool.map(one, jobs[start:start + CHUNK]))
      cuts = [cut for cut, _, _ in results if cut is not None]
      if not cuts:
        finish(start, results, None)
        continue
      pending.append((start, results))
      yield _Patches(np.concatenate(cuts))

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    for rows in inference.outputs_by_source(model, evaluate.embedding_fn(config),
                                             sources(pool), batch_size=config.eval.batch_size,
                                             compiler_options=False):
      finish(*pending.popleft(), rows['embedding'])

