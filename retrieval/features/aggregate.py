"""From patch embeddings to one descriptor per fragment, and the re-ranking of a collection.

Aggregation (config.eval.aggregation):
  'sum'   the sum of the fragment's patch embeddings (Peer et al. 2023's sum-pooling);
  'vlad'  VLAD (Jegou et al. 2010) over the patch embeddings, with k-means centres fitted on
          the evaluated set's own patches: per centre, the sum of the residuals of the
          patches assigned to it, L2-normalised (intra-normalisation), concatenated;
then power normalisation (sign(x) |x|^alpha, alpha = 0.4 as Peer et al.) and L2.

Re-ranking: SGR, similarity-graph re-ranking (Peer et al. 2023, `reranking/sgr.py` of
marco-peer/icdar23): a dense affinity exp(-(1 - s)^2 / gamma) of the cosine similarities s,
then `layers` rounds of symmetrising it, adding to each row the rows of its k strongest
neighbours weighted by their similarity, and L2-normalising the rows; the new distance is
1 - cosine of the rows. A fragment is moved towards what its neighbours resemble, so writers
with many fragments gather. No library ships it: written here in jnp, one jitted call on the
device (the host version it replaced is bench/reference_search.py's).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from sklearn.cluster import MiniBatchKMeans

from retrieval.features import pca


def sum_pool(x, starts):
  """x [T, d] patch rows -> [N, d] sums over rows starts[f]:starts[f + 1] (each >= 1 row)."""
  return np.add.reduceat(np.asarray(x, np.float64), starts[:-1], axis=0).astype(np.float32)


def vlad(x, starts, centres):
  """VLAD [N, k * d] of patch embeddings x [T, d] against `centres` [k, d]."""
  x = np.asarray(x, np.float32)
  k, d = centres.shape
  nearest = np.argmin((centres ** 2).sum(1) - 2 * x @ centres.T, axis=1)
  fragment = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
  out = np.zeros((len(starts) - 1, k, d), np.float64)
  np.add.at(out, (fragment, nearest), x - centres[nearest])
  out /= np.maximum(np.linalg.norm(out, axis=2, keepdims=True), 1e-12)
  return out.reshape(len(out), k * d).astype(np.float32)


def fit_centres(x, num_centres, seed):
  kmeans = MiniBatchKMeans(num_centres, random_state=seed, batch_size=4096, n_init=3)
  return kmeans.fit(np.asarray(x, np.float32)).cluster_centers_.astype(np.float32)


def power_l2(x, alpha):
  x = np.asarray(x, np.float32)
  return pca.l2_normalise(np.sign(x) * np.abs(x) ** alpha)


METHODS = ('sum', 'vlad')  # eval.aggregation


def fragment_descriptors(x, starts, *, method, alpha, centres=None):
  """Aggregated, power-normalised, L2-normalised descriptors [N, D] of patch embeddings."""
  pooled = sum_pool(x, starts) if method == 'sum' else vlad(x, starts, centres)
  return power_l2(pooled, alpha)


def sgr(x, *, k, layers=2, gamma=0.5):
  """SGR re-ranked cosine distances [N, N] of L2-normalised rows x [N, d]."""
  # float32: at 20k fragments each N x N array is 1.6 GB
  return np.asarray(_sgr(jnp.asarray(x, jnp.float32), jnp.float32(gamma), k=k, layers=layers))


@functools.partial(jax.jit, static_argnames=('k', 'layers'))
def _sgr(x, gamma, *, k, layers):
  s = x @ x.T
  a = jnp.exp(-(1 - s) ** 2 / gamma)
  for _ in range(layers):
    a = (a + a.T) / 2
    # The k strongest neighbours of each row after itself (the strongest is the row itself);
    # top_k puts the lower column first among equal affinities, as a stable sort does. The
    # barrier keeps XLA from folding the slice into top_k, which it then runs as a full sort.
    order = lax.optimization_barrier(lax.top_k(a, k + 1)[1])[:, 1:]
    weights = jnp.take_along_axis(s, order, axis=1)
    # a + W a, W holding k weights a row: k gathered rows added in turn (N k N, not N^3).
    a = lax.fori_loop(0, k, lambda m, acc: acc + weights[:, m, None] * a[order[:, m]], a)
    a = a / jnp.linalg.norm(a, axis=1, keepdims=True)
  d = 1 - a @ a.T
  d = (d + d.T) / 2  # exactly symmetric for the distance-matrix scorer
  return jnp.fill_diagonal(d, 0, inplace=False)


def z_normalise(d):
  """A distance matrix shifted and scaled so its off-diagonal entries have mean 0, std 1."""
  off = ~np.eye(len(d), dtype=bool)
  return ((d - d[off].mean()) / max(d[off].std(), 1e-12)).astype(np.float32)


def fuse(*distances):
  """The mean of z-normalised distance matrices (methods on different scales)."""
  return np.mean([z_normalise(d) for d in distances], axis=0).astype(np.float32)
