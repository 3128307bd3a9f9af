"""retrieval/search.py's exact search against numpy written from its definition."""
import numpy as np
import pytest

from bench import index_scale
from retrieval import metrics, search


@pytest.mark.parametrize('metric', ['euclidean', 'cityblock', 'cosine'])
def test_queries_from_outside_rank_as_the_rows_of_the_whole_matrix(metric):
  rng = np.random.default_rng(0)
  x, q = rng.normal(size=(50, 20)), rng.normal(size=(7, 20))
  expected = metrics.distance_matrix(np.concatenate([x, q]), metric=metric,
                                     rows=np.arange(50, 57))[:, :50]
  got = metrics.Against(x, metric=metric).distances(q, block_size=3)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match=r'\[Q, 20\]'):
    metrics.Against(x, metric=metric).distances(q[:, :5])


def reference(index, q, lbp_q):
  """The fused distance as retrieval/search.py's docstring defines it, over every pair."""
  e = index.entries
  def z(d_all, d_q):
    off = d_all[~np.eye(len(d_all), dtype=bool)]
    return (d_q - off.mean()) / off.std()
  enc = lambda a, b: ((a[:, None] - b[None]) ** 2).sum(-1)
  l1 = lambda a, b: np.abs(a[:, None] - b[None]).sum(-1)
  w = index.header['settings']['fusion_weight']
  return ((1 - w) * z(enc(e.descriptors, e.descriptors), enc(q, e.descriptors)) +
          w * z(l1(e.lbp, e.lbp), l1(lbp_q, e.lbp)))


def test_fused_distances_nearest_and_closest_pairs_match_numpy():
  index = index_scale.synthetic_index(300)
  searcher = search.Searcher.of(index)
  e = index.entries
  rows = np.array([3, 150, 299])
  d = searcher.distances(e.descriptors[rows], e.lbp[rows], exclude=rows)
  expected = reference(index, e.descriptors[rows], e.lbp[rows])
  expected[np.arange(3), rows] = np.inf
  np.testing.assert_allclose(d, expected, rtol=1e-4, atol=1e-4)
  top, dist = search.nearest(d, 10)
  np.testing.assert_array_equal(top, np.argsort(expected, axis=1)[:, :10])
  assert (np.diff(dist, axis=1) >= 0).all()
  assert not any(r in t for r, t in zip(rows, top))  # no query finds itself
  full = reference(index, e.descriptors, e.lbp)
  i, j = np.triu_indices(300, 1)
  best = np.argsort(full[i, j])[:15]
  pairs = search.closest_pairs(searcher, 15)
  assert [(a, b) for _, a, b in pairs] == list(zip(i[best].tolist(), j[best].tolist()))
