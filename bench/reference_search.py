"""The host (numpy) search and SGR re-ranking that the device versions replaced.

retrieval/collections/search.py's `Searcher.nearest` and `closest_pairs`, and retrieval/features/aggregate.py's
`sgr`, now run on the device and return only what they rank. This is the code they replaced,
copied verbatim: `Searcher.distances` (each block of queries' [Q, N] distances, from
retrieval/fragments/metrics.py's `Against` kernels, z-scored and fused on the host), `nearest` and
`closest_pairs` (numpy top-k over those rows) and `sgr` (numpy, a sparse neighbour matrix).
It is kept so that bench/index_scale.py times the device versions against it and
tests/retrieval/test_search.py compares their rankings with it.
"""
import numpy as np
import scipy.sparse

from retrieval.fragments import metrics

BLOCK = 256  # queries a kernel call ranks at once


class Searcher:
  """The old Searcher's distances, over the vectors of a retrieval/collections/search.py `Searcher`."""

  def __init__(self, searcher):
    self.descriptors, self.lbp = searcher.descriptors, searcher.lbp
    self.weight, self.z = searcher.weight, searcher.z
    self.encoder_kernel = metrics.Against(self.descriptors)
    self.lbp_kernel = metrics.Against(self.lbp, metric='cityblock') if self.weight else None

  def distances(self, q_descriptors, q_lbp, exclude=None):
    """[Q, N] float32 distances of queries to every item; exclude[k] >= 0 is the query's own
    row (distance +inf: a query does not find itself)."""
    (mean, std), *rest = self.z
    d = (self.encoder_kernel.distances(q_descriptors, block_size=BLOCK) - mean) / std
    if self.weight:
      (l_mean, l_std), = rest
      lbp_d = (self.lbp_kernel.distances(q_lbp, block_size=BLOCK) - l_mean) / l_std
      d = (1 - self.weight) * d + self.weight * lbp_d
    d = d.astype(np.float32)
    if exclude is not None:
      inside = np.flatnonzero(np.asarray(exclude) >= 0)
      d[inside, np.asarray(exclude)[inside]] = np.inf
    return d


def nearest(d, top):
  """(rows [Q, k], distances [Q, k]) of the k = min(top, N - 1) smallest per row, in order."""
  k = min(top, d.shape[1] - 1) if np.isinf(d).any() else min(top, d.shape[1])
  part = np.argpartition(d, k - 1, axis=1)[:, :k]
  order = np.take_along_axis(d, part, 1).argsort(axis=1, kind='stable')
  rows = np.take_along_axis(part, order, 1)
  return rows, np.take_along_axis(d, rows, 1)


def closest_pairs(searcher, top):
  """The `top` closest pairs (i < j) of the collection, [(distance, i, j)] in order, ranking
  every item against every other a block at a time."""
  n = len(searcher.descriptors)
  best = np.zeros((0, 3))
  for start in range(0, n, BLOCK):
    rows = np.arange(start, min(start + BLOCK, n))
    d = searcher.distances(searcher.descriptors[rows], searcher.lbp[rows])
    d[np.arange(n)[None, :] <= rows[:, None]] = np.inf  # each pair once, never an item itself
    flat = d.ravel()
    k = min(top, np.isfinite(flat).sum())
    if not k:
      continue
    pick = np.argpartition(flat, k - 1)[:k]
    found = np.stack([flat[pick], rows[pick // n], pick % n], axis=1)
    best = np.concatenate([best, found])
    best = best[np.lexsort((best[:, 2], best[:, 1], best[:, 0]))][:top]
  return [(float(dist), int(i), int(j)) for dist, i, j in best]


def sgr(x, *, k, layers=2, gamma=0.5):
  """SGR re-ranked cosine distances [N, N] of L2-normalised rows x [N, d]."""
  x = np.asarray(x, np.float32)  # float32: at 20k fragments each N x N copy is 1.6 GB
  s = x @ x.T
  a = np.exp(-(1 - s) ** 2 / gamma)
  n = len(x)
  for _ in range(layers):
    a = (a + a.T) / 2
    # The k strongest neighbours of each row after itself (the strongest is the row itself).
    order = np.argsort(-a, axis=1, kind='stable')[:, 1:k + 1]
    rows = np.repeat(np.arange(n), order.shape[1])
    weights = scipy.sparse.csr_matrix((s[rows, order.ravel()], (rows, order.ravel())), (n, n))
    a = a + weights @ a
    a /= np.linalg.norm(a, axis=1, keepdims=True)
  d = 1 - a @ a.T
  d = (d + d.T) / 2  # exactly symmetric for the distance-matrix scorer
  np.fill_diagonal(d, 0)
  return d
