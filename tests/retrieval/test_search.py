"""retrieval/collections/search.py's exact search against numpy written from its definition, and the
device search and SGR re-ranking against the host code they replaced
(bench/reference_search.py): the same rankings, ties included."""
import dataclasses

import numpy as np
import pytest

from bench import index_scale, reference_search
from retrieval.features import aggregate
from retrieval.fragments import metrics
from retrieval.collections import search


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
  """The fused distance as retrieval/collections/search.py's docstring defines it, over every pair."""
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
  expected = reference(index, e.descriptors[rows], e.lbp[rows])
  expected[np.arange(3), rows] = np.inf
  # All 299 others: every fused distance, in order.
  top, dist = searcher.nearest(e.descriptors[rows], e.lbp[rows], 300, exclude=rows)
  assert top.shape == (3, 299)
  np.testing.assert_allclose(dist, np.take_along_axis(expected, top, 1), rtol=1e-4, atol=1e-4)
  top, dist = searcher.nearest(e.descriptors[rows], e.lbp[rows], 10, exclude=rows)
  np.testing.assert_array_equal(top, np.argsort(expected, axis=1)[:, :10])
  assert (np.diff(dist, axis=1) >= 0).all()
  assert not any(r in t for r, t in zip(rows, top))  # no query finds itself
  full = reference(index, e.descriptors, e.lbp)
  i, j = np.triu_indices(300, 1)
  best = np.argsort(full[i, j])[:15]
  pairs = search.closest_pairs(searcher, 15)
  assert [(a, b) for _, a, b in pairs] == list(zip(i[best].tolist(), j[best].tolist()))


def random_index(n, seed, **settings):
  """synthetic_index's layout with unnormalised Gaussian descriptors, and `settings`."""
  index = index_scale.synthetic_index(n, seed)
  rng = np.random.default_rng(seed)
  entries = dataclasses.replace(index.entries,
                                descriptors=rng.normal(size=(n, 24)).astype(np.float32) * 3)
  return dataclasses.replace(index, entries=entries,
                             header=dict(index.header, settings={**index.header['settings'],
                                                                 **settings}))


INDEXES = {
    'synthetic': lambda: index_scale.synthetic_index(700),
    'random, whitened, fused': lambda: random_index(600, 1, whitening_dims=16,
                                                    fusion_weight=0.4),
    'random, encoder only': lambda: random_index(600, 2, fusion_weight=0.0),
}


def assert_same_nearest(searcher, host, q, q_lbp, top, exclude):
  rows, dist = searcher.nearest(q, q_lbp, top, exclude)
  ref_rows, ref_dist = reference_search.nearest(host.distances(q, q_lbp, exclude), top)
  np.testing.assert_array_equal(rows, ref_rows)
  np.testing.assert_allclose(dist, ref_dist, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('name', INDEXES)
def test_device_nearest_ranks_as_the_host_search(name):
  searcher = search.Searcher.of(INDEXES[name]())
  host = reference_search.Searcher(searcher)
  x, lbp, n = searcher.descriptors, searcher.lbp, len(searcher.descriptors)
  rng = np.random.default_rng(3)
  # More queries than a block (256, then 44 padded to 64), each in the collection, itself
  # excluded.
  rows = rng.permutation(n)[:300]
  assert_same_nearest(searcher, host, x[rows], lbp[rows], 20, rows)
  # Queries from outside, alone and with ones from inside (exclude -1: nothing left out).
  outside = x[:5] + rng.normal(size=x[:5].shape).astype(np.float32) * 0.1
  assert_same_nearest(searcher, host, outside[:1], lbp[:1], 20, None)
  assert_same_nearest(searcher, host, np.concatenate([outside, x[:2]]),
                      np.concatenate([lbp[:5], lbp[:2]]), 7, [-1] * 5 + [0, 1])


@pytest.mark.slow
@pytest.mark.parametrize('name', INDEXES)
def test_device_closest_pairs_are_the_host_pairs(name, monkeypatch):
  monkeypatch.setattr(search, 'MIN_SPAN', search.BLOCK)  # several parts at this size
  searcher = search.Searcher.of(INDEXES[name]())
  got = search.closest_pairs(searcher, 40)
  expected = reference_search.closest_pairs(reference_search.Searcher(searcher), 40)
  assert [p[1:] for p in got] == [p[1:] for p in expected]
  np.testing.assert_allclose([p[0] for p in got], [p[0] for p in expected], rtol=1e-4,
                             atol=1e-4)


def test_fewer_items_or_pairs_than_asked_for_are_all_of_them():
  searcher = search.Searcher.of(index_scale.synthetic_index(5))
  host = reference_search.Searcher(searcher)
  x, lbp = searcher.descriptors, searcher.lbp
  assert_same_nearest(searcher, host, x[:2] * 0.9, lbp[:2], 20, None)  # all 5
  assert_same_nearest(searcher, host, x[:2], lbp[:2], 20, [0, -1])  # 4: one excludes itself
  got = search.closest_pairs(searcher, 15)
  assert got == sorted(got) and len(got) == 10
  assert sorted(p[1:] for p in got) == [(i, j) for i in range(5) for j in range(i + 1, 5)]


def test_equal_distances_rank_the_lower_row_first():
  index = index_scale.synthetic_index(600)
  e = index.entries
  # Items 100, 300, 301 and 599 (the last) made copies of item 7: each query finds the
  # copies at one distance, and the closest pairs are the ten among them.
  copies = [7, 100, 300, 301, 599]
  e.descriptors[copies], e.lbp[copies] = e.descriptors[7], e.lbp[7]
  searcher = search.Searcher.of(index)
  host = reference_search.Searcher(searcher)
  q = np.concatenate([e.descriptors[copies], e.descriptors[7:8] * 0.9])
  q_lbp = np.concatenate([e.lbp[copies], e.lbp[7:8]])
  exclude = copies + [-1]
  d = host.distances(q, q_lbp, exclude)
  for row in d:
    tied = row[[c for c in copies if np.isfinite(row[c])]]
    assert (tied == tied[0]).all()  # exact ties, as the test needs
  # As a stable sort of the host's distances (the host's own argpartition left ties in no
  # set order).
  rows, dist = searcher.nearest(q, q_lbp, 6, exclude)
  assert (dist[:, :4] == dist[:, :1]).all()
  np.testing.assert_array_equal(rows, np.argsort(d, axis=1, kind='stable')[:, :6])
  np.testing.assert_array_equal(rows[:, :4], [[c for c in copies if c != own][:4]
                                              for own in exclude])
  # Six of the ten tied pairs: by i, then j.
  pairs = search.closest_pairs(searcher, 6)
  assert [p[1:] for p in pairs] == [(7, 100), (7, 300), (7, 301), (7, 599), (100, 300),
                                    (100, 301)]
  assert len({p[0] for p in pairs}) == 1


def test_sgr_on_the_device_is_the_host_sgr():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(300, 12))
  x[[40, 41, 250]] = x[5]  # copies: a row's strongest after itself ties with itself
  # Rows 60 and 61 at one angle either side of row 10, in dims where products are exact:
  # equal affinities to it, and rows unlike each other, so that at k=1 the tie decides.
  x[10], x[60], x[61] = 0, 0, 0
  x[10, 0], x[[60, 61], 0], x[60, 1], x[61, 1] = 1, 1, 0.1, -0.1
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  for k in (1, 4):
    got = aggregate.sgr(x, k=k, gamma=0.2)
    np.testing.assert_allclose(got, reference_search.sgr(x, k=k, gamma=0.2), atol=2e-5)
    assert (got == got.T).all() and (np.diag(got) == 0).all()


@pytest.mark.parametrize('damage, why', [('remove', 'no such file'),
                                         ('garble', 'unreadable image')])
def test_a_match_changed_since_indexing_is_named_with_what_to_do(tmp_path, damage, why):
  from PIL import Image
  from bengrapheme import errors
  shown = tmp_path / 'shown.png'
  Image.fromarray(np.full((20, 30, 3), 200, np.uint8)).save(shown)
  changed = tmp_path / 'changed.png'
  if damage == 'garble':
    changed.write_bytes(b'\x89PNG not any more')
  with pytest.raises(errors.UserError, match=f'{changed}: {why}.*rerun python -m launch.index'):
    search.page('t', 'intro', [('query', [(str(shown), 'q', 'red'),
                                          (str(changed), 'm', 'grey')])])


@pytest.mark.slow
@pytest.mark.parametrize('whitening_dims, fusion_weight', [(0, 0.0), (8, 0.0), (8, 0.4)])
def test_the_search_ranks_as_the_evaluator_scores(whitening_dims, fusion_weight):
  """The two fused distances, one function of the settings: search.Searcher over the
  descriptors an index stores (aggregated, power, L2) and evaluate.Pipeline.distances over the
  same patch embeddings (whitening fitted on the set itself, eval.whitening='self'), with
  every pair in the z statistics at this size. The search shows the encoder's distance
  z-normalised even without fusion: the same order."""
  from configs import fragments
  from retrieval.fragments import evaluate
  config = fragments.get_config('test')
  config.eval.whitening = 'self'
  rng = np.random.default_rng(5)
  starts = np.concatenate([[0], np.cumsum(rng.integers(1, 6, 60))])
  patches = rng.normal(size=(starts[-1], 16)).astype(np.float32)
  lbp = np.sqrt(rng.gamma(0.5, size=(60, 30))).astype(np.float32)
  settings = dict(power=0.7, whitening_dims=whitening_dims, rerank_k=0,
                  fusion_weight=fusion_weight)
  pipeline = evaluate.Pipeline(config, patches, starts, lbp, whitening_fit=None)
  expected = pipeline.distances(settings)
  if not fusion_weight:
    expected = aggregate.z_normalise(expected)
  np.fill_diagonal(expected, np.inf)

  index = index_scale.synthetic_index(60)
  entries = dataclasses.replace(index.entries, descriptors=pipeline.descriptors(0.7), lbp=lbp)
  searcher = search.Searcher.of(dataclasses.replace(
      index, entries=entries, header=dict(index.header, settings=settings)))
  rows, dist = searcher.nearest(searcher.descriptors, searcher.lbp, 59, np.arange(60))
  np.testing.assert_array_equal(rows, np.argsort(expected, axis=1, kind='stable')[:, :59])
  np.testing.assert_allclose(dist, np.take_along_axis(expected, rows, 1), rtol=1e-4,
                             atol=1e-4)
