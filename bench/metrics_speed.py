"""Metric speed: hierarchical macro recall (Bengali.AI) and retrieval metrics (HisFrag20).

  python -m bench.metrics_speed [--quick]

- Hierarchical macro recall of 200,840 x 3 predictions (the size of the Kaggle train set) by
  both paths of bengrapheme/grapheme/metrics.py, each timed in turns with sklearn's
  recall_score(average='macro') per component, weighted 2:1:1: on the host,
  `hierarchical_macro_recall` (np.bincount) of numpy labels; on the device, the jitted
  `confusion_on_device` (scatter-add) of labels already there, as the eval step counts, then
  its three matrices fetched and scored (`from_confusion`). Results must be equal (asserted).
- Retrieval metrics at the HisFrag20 test size (20,019 embeddings, d = 512, 1,152 writers,
  2,732 pages; writer and page mAP / Top-1 / Pr@10 / Pr@100 from one call),
  `retrieval.fragments.metrics.retrieval_metrics` against a numpy evaluator written the way the
  organisers' one is (wi19_evaluate: sort each query's row of distances, then cumulative sums
  over the relevance of the sorted row), by blocks of query rows so that it fits in memory.
  Results must be equal (asserted to 1e-6: the kernel sums each query's precisions in
  float32). Also timed: the bare float32 X @ X.T at full size, the
  floor any exact metric has to compute, and the peak memory (RSS high-water mark) of each,
  each contender in a process of its own.

Embeddings are small integers around a centre per writer and an offset per page, so every
distance is exact in float32 and both sides rank the very same numbers, ties included
(writer mAP ~0.4 at full size, like a good HisFrag20 model; the costs hardly depend on it).
"""
import sys
import time

import numpy as np

from bench import common

SIZES = dict(full=dict(n=20_019, writers=1_152, pages=2_732, dim=512),
             quick=dict(n=5_000, writers=288, pages=683, dim=512),
             tiny=dict(n=300, writers=20, pages=45, dim=16))  # for tests/core/test_bench.py
RECALL_ROWS = 200_840
MEMORY_LIMIT = 2e9


# ---------------------------------------------------------------- hierarchical macro recall


def sklearn_score(y_true, y_pred):
  from sklearn.metrics import recall_score
  from bengrapheme.grapheme.kaggle import COMPONENTS
  scores = {name: recall_score(y_true[:, i], y_pred[:, i], average='macro', zero_division=0)
            for i, name in enumerate(COMPONENTS)}
  scores['score'] = (2 * scores[COMPONENTS[0]] + scores[COMPONENTS[1]]
                     + scores[COMPONENTS[2]]) / 4
  return scores


def macro_recall(repeats, path='host'):
  """The row of one path of the metric ('host' or 'device'), timed in turns with sklearn."""
  import jax
  from bengrapheme.grapheme import metrics
  from bengrapheme.grapheme.kaggle import NUM_CLASSES
  rng = np.random.default_rng(0)
  draw = lambda: np.stack([rng.integers(0, c, RECALL_ROWS) for c in NUM_CLASSES], 1)
  y_true = draw()
  y_pred = np.where(rng.random(y_true.shape) < 0.9, y_true, draw())  # 90 % right
  if path == 'host':
    ours = lambda: metrics.hierarchical_macro_recall(y_true, y_pred)
    how, note = 'np.bincount of numpy labels', ''
  else:
    on_device = jax.device_put((y_true.astype(np.int32), y_pred.astype(np.int32),
                                np.ones(RECALL_ROWS, bool)))
    count = jax.jit(metrics.confusion_on_device)
    ours = lambda: metrics.from_confusion(count(*on_device))
    how, note = 'jitted scatter-add', ('labels already on the device, as in the eval step; '
                                       'fetching the matrices and scoring included; ')

  def warm(fn):
    """Times a call that follows an untimed one: both sides find the labels in cache, as
    they are right after the predictions are made (cold, this memory-bound metric pays
    ~0.4 ms more of its ~1.6 ms to read the 9.6 MB of labels again; sklearn, compute-bound,
    hardly notices, so turns alone would favour it)."""
    def timed():
      fn()
      start = time.perf_counter()
      result = fn()
      return common.Timed(time.perf_counter() - start, result)
    return timed

  turns = common.interleaved({'sklearn': warm(lambda: sklearn_score(y_true, y_pred)),
                              'ours': warm(ours)}, repeats)
  want, got = turns['sklearn'][1], turns['ours'][1]
  for key, value in want.items():
    assert abs(got[key] - value) <= 1e-12, (key, got[key], value)
  return common.timed_record(
      f'hierarchical macro recall on the {path} ({how}), {RECALL_ROWS:,} x 3', 'ms',
      'sklearn recall_score(average="macro") x 3', turns,
      lambda t: (t['ours'] * 1e3, t['sklearn'] * 1e3, t['sklearn'] / t['ours']),
      target='>= 50x', meets=lambda value, ratio: ratio >= 50, note=f'{note}equal scores (asserted); each timed call follows an '
                            'untimed one (warm caches, both sides)')


# ---------------------------------------------------------------- retrieval metrics


def retrieval_data(n, writers, pages, dim, seed=0):
  """Integer embeddings [n, dim] (float32) and writer, page ids; pages nest in writers."""
  rng = np.random.default_rng(seed)
  # Every writer has a page and every page a fragment; the rest are spread at random.
  page_writer = np.concatenate([np.arange(writers), rng.integers(0, writers, pages - writers)])
  page = rng.permutation(np.concatenate([np.arange(pages), rng.integers(0, pages, n - pages)]))
  writer = page_writer[page]
  sparse = lambda shape, share: rng.choice(np.array([-1, 0, 1], np.int8), shape,
                                          p=[share / 2, 1 - share, share / 2])
  centre, offset = sparse((writers, dim), 0.3), sparse((pages, dim), 0.1)
  x = centre[writer] + offset[page] + rng.integers(-2, 3, (n, dim), dtype=np.int8)
  x = x.astype(np.float32)  # int8 until here: the data must not set the peak memory
  return x, writer, page


def numpy_evaluator(x, writer, page, block=256):
  """Writer and page metrics the organisers' way, by blocks of query rows.

  Per query row: sort the distances (argsort), read the relevance of the sorted row, and
  take cumulative sums over it (wi19_evaluate's get_metrics). Ties go against the query: as
  the organisers' evaluator adds half the smallest distance gap to the relevant entries, this
  adds a quarter of a float32 step per labeling (pages nest in writers, so one sort serves
  both labelings: page matches sit behind writer-only matches, which sit behind the rest).
  The query itself is sorted first and dropped. Top-1 averages over every query, as
  get_all_metrics does (a query with no relevant item is a miss); the rest over the queries
  with one.
  """
  n = len(x)
  assert len(np.unique(np.stack([page, writer]), axis=1).T) == len(np.unique(page)), (
      'a page of two writers: one sort cannot serve both labelings')
  names = ('writer', 'page')
  sq = np.einsum('ij,ij->i', x, x)
  ranks = np.arange(1, n)
  sums = {k: np.zeros(5) for k in names}  # AP, top-1, Pr@10, Pr@100 sums; queries
  for start in range(0, n, block):
    q = np.arange(start, min(start + block, n))
    d = (sq[q, None] + sq[None, :] - 2 * (x[q] @ x.T)).astype(np.float64)  # float32 distances
    rel = {k: lab[q, None] == lab[None, :] for k, lab in zip(names, (writer, page))}
    key = d + (rel['writer'].astype(np.float64) + rel['page']) * (np.abs(d) * 2.0**-26
                                                                    + 2.0**-160)
    key[np.arange(len(q)), q] = -np.inf
    order = np.argsort(key, axis=1)[:, 1:]
    for k in names:
      hits = np.take_along_axis(rel[k], order, axis=1)
      n_rel = hits.sum(axis=1)
      precision = np.cumsum(hits, axis=1) / ranks
      keep = n_rel > 0
      nr = n_rel[keep]
      h = hits[keep]
      sums[k] += [((precision[keep] * h).sum(axis=1) / nr).sum(), h[:, 0].sum(),
                  (h[:, :10].sum(axis=1) / np.minimum(10, nr)).sum(),
                  (h[:, :100].sum(axis=1) / np.minimum(100, nr)).sum(), keep.sum()]
  return {k: dict(map=s[0] / s[4], top1=s[1] / n, pr10=s[2] / s[4], pr100=s[3] / s[4],
                  num_queries=int(s[4])) for k, s in sums.items()}


def _worker(contender, size):
  """Child side: sets up one contender on the data of `size` and serves timing requests."""
  def setup():
    x, writer, page = retrieval_data(**SIZES[size])
    labels = {'writer': writer, 'page': page}
    if contender == 'floor-numpy':
      def product():
        x @ x.T  # numpy sees x and its transpose and runs a symmetric rank-k update (syrk)
      return product, None
    if contender == 'floor-jax':
      import jax
      xj = jax.device_put(x)
      matmul = jax.jit(lambda a: a @ a.T)
      matmul(xj).block_until_ready()

      def product_jax():
        matmul(xj).block_until_ready()
      return product_jax, None
    if contender == 'numpy':
      return (lambda: numpy_evaluator(x, writer, page)), None
    from retrieval.fragments import metrics
    start = time.perf_counter()
    metrics.retrieval_metrics(x, labels)  # compiles
    return (lambda: metrics.retrieval_metrics(x, labels)), dict(
        first_call=time.perf_counter() - start)

  common.serve(setup)


def retrieval(size, repeats):
  shape = SIZES[size]
  workers = {}
  try:
    for name in ('floor-numpy', 'floor-jax', 'ours', 'numpy'):
      workers[name] = common.Worker('bench.metrics_speed', [name, size])
  except BaseException:
    for w in workers.values():
      w.kill()
    raise
  first_call = workers['ours'].setup['first_call']
  timed = common.time_workers(workers, repeats)
  (_, got, ours_rss), (_, want, reference_rss) = timed['ours'], timed['numpy']
  # The floor is the faster of the two matmuls: BLAS, or XLA (the compiler the metric uses).
  floor_name = min(('floor-numpy', 'floor-jax'), key=lambda k: timed[k][0])
  floor_rss = timed[floor_name][2]
  floor_other = np.median([t['floor-jax' if floor_name == 'floor-numpy' else 'floor-numpy']
                           for t in timed.each])
  for labeling, w in want.items():
    g = got[labeling]
    assert g['num_queries'] == w['num_queries'], (labeling, g, w)
    for key in ('map', 'top1', 'pr10', 'pr100'):
      assert abs(g[key] - w[key]) <= 1e-6, (labeling, key, g[key], w[key])
  floor = lambda t: min(t['floor-numpy'], t['floor-jax'])
  what = (f'{shape["n"]:,} x {shape["dim"]}, {shape["writers"]:,} writers, '
          f'{shape["pages"]:,} pages')
  scores = (f'writer mAP {got["writer"]["map"]:.3f}, page mAP {got["page"]["map"]:.3f}, '
            'equal to the reference (asserted)')
  return [
      common.timed_record(
          f'retrieval metrics ({what})', 's',
          'numpy evaluator (blocks of rows, argsort per row)', timed,
          lambda t: (t['ours'], t['numpy'], t['numpy'] / t['ours']),
          target='>= 6x', meets=lambda value, ratio: ratio >= 6,
          note=f'{scores}; first call {first_call:.1f} s with compilation'),
      common.timed_record(
          'retrieval metrics against the bare distance product', 's',
          'X @ X.T float32 at full size, the faster of numpy BLAS and jax in each turn', timed,
          lambda t: (t['ours'], floor(t), floor(t) / t['ours']),
          target='>= 0.67x (within 1.5x)', meets=lambda value, ratio: ratio >= 1 / 1.5,
          note=f'{shape["n"]**2 * shape["dim"] / 1e12:.2f} T multiply-adds as a full product; '
               'the floor is the faster of numpy (a symmetric rank-k update: half the '
               f'product, as the metric computes) and jax (mostly {floor_name[6:]}; the '
               f'other {floor_other:.2f} s)'),
      common.record(
          'retrieval metrics peak memory (RSS)', ours_rss / 1e9, 'GB',
          'numpy evaluator', reference_rss / 1e9, ratio=reference_rss / ours_rss,
          target='<= 2 GB', passed=ours_rss <= MEMORY_LIMIT,
          note=f'each in a process of its own (the bare product: {floor_rss / 1e9:.1f} GB)'),
  ]


def run(quick):
  return ([macro_recall(10 if quick else 20, path) for path in ('host', 'device')]
          + retrieval('quick' if quick else 'full', common.MIN_REPEATS))


if __name__ == '__main__':
  sys.exit(common.main(__doc__, run, _worker))
