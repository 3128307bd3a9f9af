"""retrieval.fragments.metrics against a plain numpy reference written like the organisers' evaluator.

The embeddings are small integers (or exactly normalisable +-1 patterns for cosine), so every
distance is exact in float32 and float64 alike: the kernel and the reference rank the very
same numbers, ties included, and must agree to 1e-6.
"""

import os

import numpy as np
import pytest

from retrieval.fragments import distances_io, metrics
from retrieval.features import pca

N = 101  # prime: no block size below divides it


def reference(dist, labels):
  """Argsort per row, query removed, ties broken against the query (non-relevant first);
  Top-1 over every query, a query without a relevant item counting as a miss."""
  n = len(labels)
  aps, top1, pr10, pr100 = [], [], [], []
  for q in range(n):
    others = np.delete(np.arange(n), q)
    rel = labels[others] == labels[q]
    if not rel.any():
      continue
    hits = rel[np.lexsort((rel, dist[q, others]))]
    ranks = np.flatnonzero(hits) + 1
    aps.append(np.mean(np.arange(1, len(ranks) + 1) / ranks))
    top1.append(hits[0])
    pr10.append(hits[:10].sum() / min(10, rel.sum()))
    pr100.append(hits[:100].sum() / min(100, rel.sum()))
  return dict(map=np.mean(aps), top1=np.sum(top1) / n, top1_answerable=np.mean(top1),
              pr10=np.mean(pr10), pr100=np.mean(pr100), num_queries=len(aps))


def exact_distances(x, metric):
  x = x.astype(np.float64)
  if metric == 'euclidean':
    return ((x[:, None] - x[None]) ** 2).sum(-1)
  if metric == 'cityblock':
    return np.abs(x[:, None] - x[None]).sum(-1)
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  return 1.0 - xn @ xn.T


def make_data(metric, seed=0, n=N):
  """Embeddings with many exact ties and duplicated rows; labels with singletons."""
  rng = np.random.default_rng(seed)
  if metric == 'cosine':
    # Four +-1 entries out of 8: norm exactly 2, so normalising is exact.
    x = np.zeros((n, 8), np.float32)
    for row in x:
      row[rng.choice(8, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
  else:
    x = rng.integers(-2, 3, (n, 6)).astype(np.float32)
  dup = rng.choice(n, n // 5, replace=False)
  x[dup] = x[rng.choice(n, n // 5)]  # exact duplicates: deliberate ties
  writer = rng.integers(0, 12, n)
  writer[:5] = 100 + np.arange(5)  # singleton classes
  page = writer * 4 + rng.integers(0, 4, n)
  return x, writer, page


def assert_same(got, want):
  assert got['num_queries'] == want['num_queries']
  for key in ('map', 'top1', 'top1_answerable', 'pr10', 'pr100'):
    assert isinstance(got[key], float)
    assert abs(got[key] - want[key]) <= 1e-6, (key, got[key], want[key])


@pytest.mark.slow
@pytest.mark.parametrize('metric,block_size', [('euclidean', 7), ('cosine', 16), ('cityblock', 32)])
def test_matches_reference(metric, block_size):
  x, writer, _ = make_data(metric)
  got = metrics.retrieval_metrics(x, writer, metric=metric, block_size=block_size)
  assert_same(got, reference(exact_distances(x, metric), writer))


@pytest.mark.parametrize('block_size', [64, 1000])
def test_block_size_does_not_matter(block_size):
  x, writer, _ = make_data('euclidean', seed=1)
  want = reference(exact_distances(x, 'euclidean'), writer)
  assert_same(metrics.retrieval_metrics(x, writer, block_size=block_size), want)


def test_writer_and_page_in_one_pass():
  x, writer, page = make_data('euclidean', seed=2)
  d = exact_distances(x, 'euclidean')
  got = metrics.retrieval_metrics(x, {'writer': writer, 'page': page}, block_size=7)
  assert set(got) == {'writer', 'page'}
  assert_same(got['writer'], reference(d, writer))
  assert_same(got['page'], reference(d, page))
  # Singleton writers (and their pages) never count as queries.
  assert got['writer']['num_queries'] == N - 5


def test_nested_labels_many_blocks():
  # HisFrag-like: pages nested in writers, many blocks on the ring, so candidate sets become
  # runs of positions and only the first tiles of each ring row hold candidate pairs.
  rng = np.random.default_rng(7)
  n = 331
  page = rng.integers(0, 60, n)
  writer = page // 3
  x = rng.integers(-2, 3, (n, 6)).astype(np.float32)
  x[rng.choice(n, 40, replace=False)] = x[rng.choice(n, 40)]
  d = exact_distances(x, 'euclidean')
  got = metrics.retrieval_metrics(x, {'writer': writer, 'page': page}, block_size=16)
  assert_same(got['writer'], reference(d, writer))
  assert_same(got['page'], reference(d, page))


def test_all_tied_scores_worst_case():
  # Every item at the same place: the query loses all ties, relevant items rank last.
  x = np.ones((N, 4), np.float32)
  labels = np.arange(N) % 10
  got = metrics.retrieval_metrics(x, labels, block_size=7)
  assert_same(got, reference(np.zeros((N, N)), labels))
  assert got['top1'] == 0.0


def test_distance_matrix_entry_point_equals_embedding_one():
  x, writer, page = make_data('euclidean', seed=3)
  labels = {'writer': writer, 'page': page}
  d = metrics.distance_matrix(x, block_size=16)
  np.testing.assert_array_equal(d, exact_distances(x, 'euclidean'))
  from_matrix = metrics.metrics_from_distances(d, labels, block_size=7)
  from_embeddings = metrics.retrieval_metrics(x, labels, block_size=7)
  for key in labels:
    assert_same(from_matrix[key], from_embeddings[key])


def test_distance_matrix_with_arbitrary_values():
  # Generic float distances: the counting must agree with the argsort reference exactly.
  rng = np.random.default_rng(4)
  a = rng.standard_normal((N, N)).astype(np.float32)
  d = (a + a.T) / 2
  d[rng.random((N, N)) < 0.05] = 0.5  # plus plenty of exact ties
  d = np.minimum(d, d.T)
  labels = rng.integers(0, 9, N)
  assert_same(metrics.metrics_from_distances(d, labels, block_size=7), reference(d, labels))


def test_distance_validation():
  d = np.zeros((4, 4))
  labels = np.arange(4) % 2
  with pytest.raises(ValueError, match='square'):
    metrics.metrics_from_distances(np.zeros((4, 3)), labels)
  with pytest.raises(ValueError, match=r'shape \(4,\)'):
    metrics.metrics_from_distances(d, np.arange(5))
  bad = d.copy()
  bad[1, 2] = np.nan
  with pytest.raises(ValueError, match='NaN or Inf'):
    metrics.metrics_from_distances(bad, labels)
  bad[1, 2] = np.inf
  with pytest.raises(ValueError, match='NaN or Inf'):
    metrics.metrics_from_distances(bad, labels)
  bad = np.arange(16.0).reshape(4, 4)
  with pytest.raises(ValueError, match='not symmetric'):
    metrics.metrics_from_distances(bad, labels)


def test_embedding_validation():
  x = np.zeros((4, 3), np.float32)
  with pytest.raises(ValueError, match='metric'):
    metrics.retrieval_metrics(x, np.arange(4), metric='hamming')
  with pytest.raises(ValueError, match=r"labels 'page' must have shape \(4,\)"):
    metrics.retrieval_metrics(x, {'writer': np.arange(4), 'page': np.arange(3)})
  x[0, 0] = np.nan
  with pytest.raises(ValueError, match='NaN or Inf'):
    metrics.retrieval_metrics(x, np.arange(4))


def organisers_load_dm(dm_fname, gt_fname):
  """The CSV branch of the HisFrag20 organisers' reader (anguelos/wi19_evaluate, wi19/util.py
  `load_dm`), rule for rule: every non-empty line is split at ','; its first field names the
  sample (basename up to the first '.'), every other field goes through float(); the matrix
  must be square; the columns are the samples in the order of the rows. The ground truth is
  `file,class` lines. Returns (distances, sample names, classes)."""
  fname2sample = lambda x: os.path.basename(x.strip()).split('.')[0]
  id_class = [tuple(reversed(line.split(','))) for line in
              open(gt_fname).read().strip().split('\n')]
  id2class = {fname2sample(k): int(v) for v, k in id_class}
  dm, fnames = [], []
  for line in open(dm_fname).readlines():
    if len(line.strip()) > 0:
      line = line.split(',')
      fnames.append(fname2sample(line[0]))
      dm.append([float(col) for col in line[1:]])
  dm = np.array(dm, 'float')
  assert dm.shape[0] == dm.shape[1]
  return dm, fnames, np.array([id2class[n] for n in fnames])


def organisers_get_all_metrics(d, classes):
  """(mAP, Top-1) of the organisers' evaluator, transcribed from anguelos/wi19_evaluate,
  wi19/metrics.py: `get_all_metrics` (accuracy = precision_at[:, 0].mean()) through
  `_get_precision_recall_matrices`, `_get_sorted_retrievals` (a plain np.argsort of each row,
  its first column, the query itself, removed) and `_compute_map` (queries without a relevant
  item left out)."""
  correct_retrievals = classes[None, :] == classes[:, None]
  sorted_indexes = np.argsort(d, axis=1)[:, 1:]
  sorted_retrievals = correct_retrievals[np.arange(sorted_indexes.shape[0])[:, None],
                                         sorted_indexes]
  precision_at = (np.cumsum(sorted_retrievals, axis=1).astype('float') /
                  np.cumsum(np.ones_like(sorted_retrievals), axis=1))
  accuracy = precision_at[:, 0].mean()
  valid = sorted_retrievals.sum(axis=1) > 0
  ap = ((precision_at[valid] * sorted_retrievals[valid]).sum(axis=1) /
        sorted_retrievals[valid].sum(axis=1))
  return ap.mean(), accuracy


def organisers_map(d, classes):
  return organisers_get_all_metrics(d, classes)[0]


def test_top1_and_map_as_the_organisers_with_a_single_fragment_writer():
  # 13 fragments: six writers of two, each pair nearest to each other, and one writer with a
  # single fragment: every answerable query is right, the single one cannot be.
  writers = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6])
  x = (np.arange(13) // 2 * 10.0 + np.arange(13) % 2)[:, None].astype(np.float32)
  d = metrics.distance_matrix(x)
  want_map, want_top1 = organisers_get_all_metrics(d.astype(np.float64), writers)
  got = metrics.metrics_from_distances(d, {'writer': writers})['writer']
  assert (want_map, want_top1) == (1.0, pytest.approx(12 / 13))
  assert got['map'] == pytest.approx(want_map, abs=1e-6)
  assert got['top1'] == pytest.approx(want_top1, abs=1e-6)
  assert got['top1_answerable'] == 1.0 and got['num_queries'] == 12
  assert metrics.retrieval_metrics(x, writers)['top1'] == pytest.approx(want_top1, abs=1e-6)


def test_top1_and_map_as_the_organisers_with_ties_and_singletons():
  # Distances tie in blocks: every other fragment of the query's writer at 1 (all relevant),
  # every fragment of a writer at distance |w - v| at 2 + |w - v| (all irrelevant, writers on
  # both sides tie), so no tie mixes relevant and irrelevant items and the organisers'
  # argsort order cannot change a score. Writers 7 and 8 have one fragment each.
  rng = np.random.default_rng(11)
  writers = np.concatenate([rng.permutation(np.repeat(np.arange(7), rng.integers(2, 6, 7))),
                            [7, 8]])
  gap = np.abs(writers[:, None] - writers[None]).astype(np.float64)
  d = np.where(gap == 0, 1.0, 2.0 + gap)
  np.fill_diagonal(d, 0.0)
  assert len(np.unique(d)) < 12  # many ties
  want_map, want_top1 = organisers_get_all_metrics(d, writers)
  got = metrics.metrics_from_distances(d.astype(np.float32), {'writer': writers})['writer']
  assert got['map'] == pytest.approx(want_map, abs=1e-6)
  assert got['top1'] == pytest.approx(want_top1, abs=1e-6)
  assert got['top1'] < got['top1_answerable'] == 1.0
  # Where a relevant item ties with an irrelevant one, the project's query loses the tie: the
  # organisers' scores with the relevant entries nudged after their ties.
  d[0, 1:] = d[1:, 0] = 1.0
  loses_ties = d + 1e-6 * (writers[:, None] == writers[None])
  np.fill_diagonal(loses_ties, 0.0)
  want_map, want_top1 = organisers_get_all_metrics(loses_ties, writers)
  got = metrics.metrics_from_distances(d.astype(np.float32), {'writer': writers})['writer']
  assert got['map'] == pytest.approx(want_map, abs=1e-6)
  assert got['top1'] == pytest.approx(want_top1, abs=1e-6)


def test_csv_default_is_what_the_organisers_evaluator_reads(tmp_path):
  rng = np.random.default_rng(5)
  writers = np.repeat(np.arange(5), 4)
  x = rng.standard_normal((20, 8)) + 2 * rng.standard_normal((5, 8))[writers]
  d = metrics.distance_matrix(x.astype(np.float32))
  names = [f'{w}_{k // 2}_{k}.jpg' for k, w in enumerate(writers)]
  path = tmp_path / 'dm.csv'
  distances_io.write_distance_csv(path, d, names)
  (tmp_path / 'gt.csv').write_text(''.join(f'{n},{w}\n' for n, w in zip(names, writers)))
  back, samples, classes = organisers_load_dm(str(path), str(tmp_path / 'gt.csv'))
  np.testing.assert_array_equal(back.astype(np.float32), d)
  assert samples == [n.split('.')[0] for n in names]
  np.testing.assert_array_equal(classes, writers)
  # Distances without ties: the organisers' mAP is the project's.
  assert organisers_map(back, classes) == pytest.approx(
      metrics.metrics_from_distances(d, {'writer': writers})['writer']['map'], abs=1e-6)
  # Our reader reads it back bit-exact, names included.
  ours, our_names = distances_io.read_distance_csv(path)
  np.testing.assert_array_equal(ours.astype(np.float32), d)
  assert our_names == names
  # Created with the permissions of every other output (0644 under the usual umask).
  umask = os.umask(0)
  os.umask(umask)
  assert path.stat().st_mode & 0o777 == 0o666 & ~umask
  assert os.listdir(tmp_path) == ['dm.csv', 'gt.csv']  # no temporary left behind


def test_csv_header_variant_round_trips(tmp_path):
  rng = np.random.default_rng(5)
  d = rng.random((6, 6)).astype(np.float32)
  names = [f'{w}_{p}_{f}.jpg' for w, p, f in rng.integers(0, 99, (6, 3))]
  path = tmp_path / 'dm.csv'
  distances_io.write_distance_csv(path, d, names, header=True)
  lines = path.read_text().splitlines()
  assert lines[0] == ',' + ','.join(names)  # a header of file names
  assert len(lines) == 7 and lines[3].split(',')[0] == names[2]
  back, back_names = distances_io.read_distance_csv(path)
  np.testing.assert_array_equal(back.astype(np.float32), d)
  assert back_names == names
  (tmp_path / 'gt.csv').write_text(''.join(f'{n},0\n' for n in names))
  with pytest.raises(ValueError, match='could not convert string to float'):
    organisers_load_dm(str(path), str(tmp_path / 'gt.csv'))  # why it is not the default


def test_csv_failed_write_leaves_old_file(tmp_path):
  path = tmp_path / 'dm.csv'
  distances_io.write_distance_csv(path, np.eye(2), ['a.jpg', 'b.jpg'])
  before = path.read_text()
  with pytest.raises(ValueError, match='comma'):
    distances_io.write_distance_csv(path, np.eye(2), ['a,1.jpg', 'b.jpg'])
  with pytest.raises(TypeError):
    distances_io.write_distance_csv(path, np.array([[0, 1], [1, None]], object), ['a.jpg', 'b.jpg'])
  assert path.read_text() == before
  assert os.listdir(tmp_path) == ['dm.csv']


def test_csv_reads_header_layout(tmp_path):
  path = tmp_path / 'dm.csv'
  path.write_text('a.jpg,b.jpg,c.jpg\n0,1,2\n1,0,3\n2,3,0\n')
  d, names = distances_io.read_distance_csv(path)
  assert names == ['a.jpg', 'b.jpg', 'c.jpg']
  np.testing.assert_array_equal(d, [[0, 1, 2], [1, 0, 3], [2, 3, 0]])
  path.write_text(',a.jpg,b.jpg\na.jpg,0,1\nb.jpg,1,0\n')
  d, names = distances_io.read_distance_csv(path)
  assert names == ['a.jpg', 'b.jpg'] and d[0, 1] == 1


def test_pca_whitening():
  rng = np.random.default_rng(6)
  train = rng.standard_normal((500, 16)) @ rng.standard_normal((16, 16)) + 3.0
  params = pca.fit(train, 8, whiten=True)
  y = pca.project(params, train)
  np.testing.assert_allclose(np.cov(y, rowvar=False), np.eye(8), atol=1e-3)
  out = pca.l2_normalise(pca.project(params, train[:10]))
  assert out.shape == (10, 8) and out.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
  again = pca.fit(train, 8, whiten=True)
  np.testing.assert_array_equal(params.components, again.components)
  np.testing.assert_array_equal(params.scale, again.scale)
  with pytest.raises(ValueError, match='dim'):
    pca.fit(train, 17, whiten=True)
