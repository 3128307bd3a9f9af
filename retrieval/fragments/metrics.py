"""Retrieval metrics for HisFrag20-style scoring, from embeddings or a distance matrix.

Scoring follows the organisers' evaluator (anguelos/wi19_evaluate, `wi19/metrics.py`,
`get_all_metrics`): every item is a query against all others (the query itself is never
retrieved); relevant = same label. Per query, with relevant items at 1-based ranks
r_1 < r_2 < ...:

  AP     = mean_i (i / r_i)
  Top-1  = 1 if the rank-1 item is relevant
  Pr@K   = (relevant items in the top K) / min(K, number of relevant items)

mAP, Pr@10 and Pr@100 average over the queries with at least one relevant item (`num_queries`);
Top-1 averages over every query, as theirs does (`precision_at[:, 0].mean()`): a query whose
class has no other item counts as a miss. `top1_answerable` is Top-1 over mAP's queries only.

Ties: items at equal distance are ordered non-relevant first, i.e. the query loses every tie.
`get_all_metrics` orders each row with a plain `np.argsort`, so there the column order breaks
ties; the two agree whenever no relevant item ties with a non-relevant one. Losing ties makes
the result fully determined by the distances and labels (not by item order), and a degenerate
embedding that maps everything to one point scores the worst, not by luck of the index order.

How it is computed: nothing is sorted per row. The rank of a relevant item j of query q is
1 + #{non-relevant k != q: d(q, k) <= d(q, j)} + #{relevant items before j}, so per query
only the counts of items at or below each relevant distance are needed: one compare-and-add
per (item, relevant item) pair. Relevant sets are small (HisFrag20 test: ~17 per writer, ~7
per page), so this costs far less than sorting 20k distances per row. Top-1 and Pr@K follow
from the same ranks. Several labelings (writer, page) share one pass: a query's thresholds are
its candidates, the union of its classes over all labelings, since how many items lie at or
below a distance does not depend on the labeling.

From embeddings each pair distance is computed once (the matrix is symmetric), which halves
the matmul that dominates the cost. Items are cut into an odd number of blocks on a ring;
block i meets itself and the next half of the ring in one [half ring, block] distance product,
whose rows count for block i's queries and whose transposed tiles count for the other blocks'
queries. Candidate pairs are masked out of those products; their distances are computed
directly (a few per query) and counted separately, so thresholds and counts always use the
same numbers. Items are ordered by candidate-set size, then by label combination, so that a
block only loops over as many threshold chunks as it needs and, for nested labelings (a page
belongs to one writer), each block's candidates are a short run of positions: one small
product gives their distances. Unnested labelings stay correct but may widen that product up
to a full extra pass.

Cost: the N^2 d / 2 product plus N x sum over queries of their candidate-set sizes
compare-and-adds (single-threaded in XLA:CPU); memory O(N x (block + largest candidate set)).
Built for many small classes; a labeling with classes of thousands of items is slow.
"""

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

METRICS = ('euclidean', 'cosine', 'cityblock')

# Thresholds are counted CHUNK at a time; distance rows GROUP at a time. Measured on a
# 2-core AVX-512 host: a scan over GROUP rows of a [rows, block] distance array, with the
# thresholds of CHUNK candidates laid out as [CHUNK, block], is what XLA vectorises best
# (a plain reduction over the distance axis runs ~10x slower).
CHUNK = 16
GROUP = 4
# Feature dims summed per step of the L1 distance (unrolled): fewer passes over the
# [rows, block] accumulator; 16 measured ~4x faster than 8 at d = 200.
L1_DIMS = 16


def retrieval_metrics(embeddings, labels, *, metric='euclidean', block_size=256,
                      per_query=False):
  """Retrieval metrics of all-vs-all queries over `embeddings` [N, d].

  `labels`: one labeling ([N] array of ids: writer or page ids) -> a dict with `map`, `top1`,
  `pr10`, `pr100` (Python floats) and `num_queries` (int, queries with a relevant item); or a
  mapping name -> labeling (e.g. {'writer': w, 'page': p}) -> {name: that dict}, all computed
  in one pass over the distances.

  `metric`: 'euclidean' ranks by squared Euclidean distance (same order, fewer rounding
  merges than taking the root), 'cosine' by 1 - cosine similarity, 'cityblock' by L1 distance.
  Distances are computed in float32. per_query: each labeling's dict also holds `ap`, float64
  [N], the AP of each item as a query (NaN for one without a relevant item), whose mean over
  the finite entries is `map`; and `ranks`, int32 [N, R], the 1-based ranks of each query's
  relevant items in ascending order, padded with 0 (R: the most any query has).
  """
  x = _prepare(embeddings, metric)
  names, codes = _encode_labels(labels, x.shape[0])
  n = x.shape[0]
  cand, order, b, nb, n_chunks = _plan(codes, block_size, odd=True)
  n_pad = nb * b
  # Position p holds item order[p]; positions from n on are dummies, kept at +inf distance.
  position = np.append(np.argsort(order), n_pad).astype(np.int32)
  cand_p = np.full((nb, b, cand.shape[1]), n_pad, np.int32)
  cand_p.reshape(n_pad, -1)[:n] = position[cand[order]]
  cand_p = cand_p.transpose(0, 2, 1)  # [nb, M, b]
  codes_p = np.full((codes.shape[0], n_pad), -1, np.int32)
  codes_p[:, :n] = codes[:, order]
  xp = np.zeros((n_pad, x.shape[1]), np.float32)
  xp[:n] = x[order]
  bias = _bias(xp, metric)
  bias[n:] = np.inf  # dummies: at +inf from everything

  # Pass 1: each block's thresholds, from a product with the positions holding its candidates.
  valid = cand_p < n_pad
  lo = np.where(valid, cand_p, n_pad).min(axis=(1, 2))
  hi = np.where(valid, cand_p, -1).max(axis=(1, 2))
  lo = np.where(hi >= 0, lo, 0)
  window = -(-int(np.maximum(hi - lo + 1, 1).max()) // GROUP) * GROUP
  # Padded so that a window never runs off the end (dynamic_slice would shift it back).
  xw = jnp.asarray(np.pad(xp, ((0, window), (0, 0))))
  bw = jnp.asarray(np.pad(bias, (0, window), constant_values=np.inf))
  queries = np.arange(n_pad, dtype=np.int32).reshape(nb, b)
  thr, cand_le = map(jnp.stack, zip(*[
      _candidate_block(xw, bw, cand_p[i], queries[i], lo[i], n_chunks[i], metric=metric,
                       window=window) for i in range(nb)]))

  # Pass 2: every pair once, around the ring unrolled so that rows i * b ..
  # i * b + (nb // 2 + 1) * b are contiguous for every block i.
  ring = np.arange(n_pad + (nb // 2) * b) % n_pad
  x2, b2, codes2 = jnp.asarray(xp[ring]), jnp.asarray(bias[ring]), jnp.asarray(codes_p[:, ring])
  # Candidate pairs can only sit in the first `head` tiles of a ring row: pair (i, k) is in
  # row i at offset k - i, or in row k at offset i - k (mod nb), whichever is at most nb // 2.
  offset = (cand_p // b - np.arange(nb)[:, None, None]) % nb
  head = int(np.minimum(offset, nb - offset)[valid].max(initial=0)) + 1
  counts = jnp.zeros(thr.shape, jnp.int32)
  jn_chunks = jnp.asarray(n_chunks)
  for i in range(nb):
    counts = _ring_row(x2, b2, codes2, i, thr, jn_chunks, counts, metric=metric, head=head)

  # Pass 3: ranks and per-query stats.
  codes_p = jnp.asarray(codes_p)
  stats, ranks = zip(*[
      _ring_stats(thr, counts, cand_le, i, cand_p[i], queries[i], codes_p, n_chunks[i])
      for i in range(nb)])
  by_item = lambda blocks: np.concatenate([np.asarray(s) for s in blocks], 2)[:, :, position[:n]]
  return _summarise(names, by_item(stats), by_item(ranks) if per_query else None)


def metrics_from_distances(distances, labels, *, item_names=None, block_size=256,
                           symmetry_tol=1e-4):
  """Same metrics as `retrieval_metrics` from an [N, N] distance matrix.

  Row q holds the distances from query q; the diagonal is ignored (the query is excluded by
  index). Distances are compared in float32. Raises ValueError naming the problem when the
  matrix is not square, does not match len(labels), holds NaN/Inf, or is not symmetric within
  `symmetry_tol` times the largest absolute distance; `item_names` (one per item), when
  given, name the offending rows and columns.
  """
  d = np.asarray(distances)
  if d.ndim != 2 or d.shape[0] != d.shape[1]:
    raise ValueError(f'distance matrix must be square, got shape {d.shape}')
  n = d.shape[0]
  if n < 2:
    raise ValueError('distance matrix needs at least 2 items')
  names, codes = _encode_labels(labels, n)
  _check_distances(d, symmetry_tol, block_size, item_names)
  cand, order, b, nb, n_chunks = _plan(codes, block_size, odd=False)
  # The last block is topped up with repeats of the last query; their stats are dropped.
  queries = np.append(order, np.full(nb * b - n, order[-1])).reshape(nb, b)
  jcodes = jnp.asarray(codes)
  stats = [_rows_block(jnp.asarray(d[q], np.float32), cand[q].T, q, jcodes, n_chunks[i])[0]
           for i, q in enumerate(queries)]
  return _summarise(names, np.concatenate([np.asarray(s) for s in stats], axis=2)[:, :, :n])


def distance_matrix(embeddings, *, metric='euclidean', block_size=256, rows=None):
  """The float32 distances `retrieval_metrics` ranks by: [N, N] (for export), or only the
  rows of the items `rows` (e.g. the queries a report shows), [len(rows), N]."""
  against = Against(embeddings, metric=metric)
  rows = np.arange(len(against)) if rows is None else np.asarray(rows)
  return against.rows(rows, block_size=block_size)


class Against:
  """A set of embeddings [N, d] held on the device once, for the distances of any queries
  to every item (what a search of an index runs, one block of queries at a time)."""

  def __init__(self, embeddings, *, metric='euclidean'):
    self.metric = metric
    x = _prepare(embeddings, metric)
    self.dims = np.asarray(embeddings).shape[1]
    self.x, self.bias = jnp.asarray(x), jnp.asarray(_bias(x, metric))

  def __len__(self):
    return self.x.shape[0]

  def rows(self, rows, *, block_size=256):
    """[len(rows), N]: the items `rows` as queries."""
    return self._blocks(len(rows), block_size,
                        lambda s, e: (self.x[rows[s:e]], self.bias[rows[s:e]]))

  def distances(self, queries, *, block_size=256):
    """[len(queries), N]: queries [Q, d], embeddings like the set's, against every item."""
    q = np.asarray(queries, np.float32)
    if q.ndim != 2 or q.shape[1] != self.dims or not np.isfinite(q).all():
      raise ValueError(f'queries must be finite [Q, {self.dims}], got shape {q.shape}')
    if self.metric == 'cosine':
      q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), np.finfo(np.float32).tiny)
    elif self.metric == 'cityblock':
      q = np.pad(q, ((0, 0), (0, -q.shape[1] % L1_DIMS)))
    bias = _bias(q, self.metric)
    return self._blocks(len(q), block_size, lambda s, e: (q[s:e], bias[s:e]))

  def _blocks(self, count, block_size, block):
    out = np.empty((count, len(self)), np.float32)
    for s in range(0, count, block_size):
      xq, bias_q = block(s, min(s + block_size, count))
      out[s:s + len(xq)] = np.asarray(_distances(self.x, self.bias, jnp.asarray(xq),
                                                 jnp.asarray(bias_q), metric=self.metric)).T
    return out


# ---------------------------------------------------------------------------- kernels


@functools.partial(jax.jit, static_argnames='metric')
def _distances(x, bias, xq, bias_q, *, metric):
  """[rows of x, rows of xq] distances: bias_x + bias_q + (-2 x.q | -x.q | |x - q|_1).

  See `_bias`: |x|^2 for euclidean, 1/2 for cosine, 0 for cityblock; +inf drops an item.
  """
  pair = bias[:, None] + bias_q[None, :]
  if metric != 'cityblock':
    return pair - (2.0 if metric == 'euclidean' else 1.0) * (x @ xq.T)
  xt = x.T.reshape(-1, L1_DIMS, x.shape[0])
  xqt = xq.T.reshape(-1, L1_DIMS, xq.shape[0])

  def step(acc, dims):
    xs, qs = dims
    for k in range(L1_DIMS):  # unrolled adds fuse into one vectorised loop; a sum would not
      acc = acc + jnp.abs(xs[k][:, None] - qs[k][None, :])
    return acc, None

  acc, _ = lax.scan(step, jnp.zeros((x.shape[0], xq.shape[0]), x.dtype), (xt, xqt))
  return acc + pair


@functools.partial(jax.jit, static_argnames=('metric', 'window'))
def _candidate_block(x, bias, cand, q, lo, n_chunks, *, metric, window):
  """Thresholds [M, B]: distances from queries q to their candidates cand [M, B] (+inf where
  padding or the query itself), and for each, how many candidates lie at or below it.

  All candidates lie in positions lo .. lo + window - 1 (items are ordered so that candidate
  sets are runs): one small product gives their distances, where gathering candidate rows and
  reducing over d would be ~10x slower.
  """
  n = x.shape[0] - window  # x carries `window` rows of padding
  valid = (cand < n) & (cand != q[None, :])
  near = lambda a: lax.dynamic_slice_in_dim(a, lo, window)
  dist = _distances(near(x), near(bias), x[q], bias[q], metric=metric)  # [window, B]
  dist = jnp.take_along_axis(dist, jnp.clip(cand - lo, 0, window - 1), axis=0)
  thr = jnp.where(valid, dist, jnp.inf)
  return thr, _count_at_or_below(thr, thr, n_chunks)


@functools.partial(jax.jit, static_argnames=('metric', 'head'), donate_argnames='counts')
def _ring_row(x2, bias2, codes2, i, thr, n_chunks, counts, *, metric, head):
  """Adds the non-candidate counts of ring row i to counts [nb, M, b].

  Rows of the product are items i*b .. i*b + (nb // 2 + 1) * b of the unrolled ring; its
  columns are block i's queries. Candidate pairs, all within the first `head` tiles, are
  set to +inf there: they are counted from their own distances (`_candidate_block`).
  """
  nb, _, b = thr.shape
  width = (nb // 2 + 1) * b
  take = lambda a, axis: lax.dynamic_slice_in_dim(a, i * b, width, axis=axis)
  xs, bs, codes = take(x2, 0), take(bias2, 0), take(codes2, 1)[:, :head * b]
  dist = _distances(xs, bs, xs[:b], bs[:b], metric=metric)  # [width, b]
  same = jnp.any(codes[:, :, None] == codes[:, None, :b], axis=0)
  dist = dist.at[:head * b].set(jnp.where(same, jnp.inf, dist[:head * b]))
  counts = counts.at[i].add(_count_at_or_below(dist, thr[i], n_chunks[i]))

  def tile(j, counts):
    k = (i + j) % nb
    rows = lax.dynamic_slice_in_dim(dist, j * b, b).T  # block i's items x block k's queries
    return counts.at[k].add(_count_at_or_below(rows, thr[k], n_chunks[k]))

  return lax.fori_loop(1, nb // 2 + 1, tile, counts)


@jax.jit
def _ring_stats(thr, counts, cand_le, i, cand, q, codes, n_chunks):
  return _block_stats(thr[i], counts[i] + cand_le[i], cand, q, codes, n_chunks)


@jax.jit
def _rows_block(rows, cand, q, codes, n_chunks):
  """Stats of the queries q from their distance rows [B, N] (a given matrix)."""
  dt = rows.T
  valid = (cand < codes.shape[1]) & (cand != q[None, :])
  c = jnp.minimum(cand, codes.shape[1] - 1)
  thr = jnp.where(valid, jnp.take_along_axis(dt, c, axis=0), jnp.inf)
  self_d = jnp.take_along_axis(dt, q[None, :], axis=0)
  le = _count_at_or_below(dt, thr, n_chunks) - (self_d <= thr).astype(jnp.int32)
  return _block_stats(thr, le, cand, q, codes, n_chunks)


def _block_stats(thr, le, cand, q, codes, n_chunks):
  """Per-query stats of one block from its candidates' distances and counts.

  thr: [M, B] distance of query q[b] to candidate cand[:, b] (+inf if padding or q itself);
  le: [M, B] number of items other than the query at or below it; codes: [L, N] class of
  each item per labeling. Returns [5, L, B] float32 sums over each query's relevant items:
  precision at their ranks, top-1 hits, hits in the top 10, in the top 100, and their number;
  and [L, M, B] int32 the rank of each relevant candidate (0 for the others).

  Ranks without sorting: with the relevant items ordered by (distance, slot), the one at
  position p among them has p - 1 relevant items before it and, the query losing ties,
  le - (relevant items at or below its distance) non-relevant ones.
  """
  n_lab, (m, b) = codes.shape[0], thr.shape
  c = jnp.minimum(cand, codes.shape[1] - 1)
  rel = (thr < jnp.inf) & (codes[:, c] == codes[:, q][:, None, :])  # [L, M, B]
  # The labelings side by side as extra queries: [M, L * B].
  side = lambda a: jnp.moveaxis(a, 0, 1).reshape(m, n_lab * b)
  t = side(jnp.where(rel, thr, jnp.inf))
  unside = lambda a: jnp.moveaxis(a.reshape(m, n_lab, b), 1, 0)
  pos, rel_le = map(unside, _count_at_or_below(t, t, n_chunks, positions=True))
  rank = pos + le[None] - rel_le
  # One reduction for all five (XLA:CPU compile time grows with each reduction).
  terms = jnp.stack([pos / rank, rank == 1, rank <= 10, rank <= 100, jnp.ones_like(rel)])
  return jnp.sum(jnp.where(rel, terms, 0.0), axis=2), jnp.where(rel, rank, 0)


def _count_at_or_below(dt, thr, n_chunks, *, positions=False):
  """[M, B] count of rows of dt [rows, B] at or below each threshold thr [M, B].

  Only the first n_chunks chunks of thresholds are counted (the rest stay 0): items are
  ordered so that a block's candidates fit in n_chunks * CHUNK. With positions=True (dt is
  thr) also returns, first, the counts that break ties by row: a row equal to threshold m
  counts only if its index is <= m, which gives equal thresholds distinct positions.
  """
  if dt.shape[0] % GROUP:
    dt = jnp.pad(dt, ((0, -dt.shape[0] % GROUP), (0, 0)), constant_values=jnp.inf)
  groups = dt.reshape(-1, GROUP, dt.shape[1])
  n_out = 2 if positions else 1

  def chunk(i, counts):
    t = lax.dynamic_slice_in_dim(thr, i * CHUNK, CHUNK, axis=0)[None]
    own = i * CHUNK + lax.broadcasted_iota(jnp.int32, (1, CHUNK, 1), 1)

    def step(carry, rows):
      acc, first = carry
      rows = rows[:, None, :]
      hits = [rows <= t]
      if positions:
        index = first + lax.broadcasted_iota(jnp.int32, (GROUP, 1, 1), 0)
        hits.insert(0, (rows < t) | ((rows == t) & (index <= own)))
      acc = [a + jnp.sum(h.astype(jnp.int32), axis=0) for a, h in zip(acc, hits)]
      return (acc, first + GROUP), None

    zeros = [jnp.zeros(t.shape[1:], jnp.int32)] * n_out
    (acc, _), _ = lax.scan(step, (zeros, jnp.int32(0)), groups)
    return [lax.dynamic_update_slice_in_dim(c, a, i * CHUNK, axis=0) for c, a in zip(counts, acc)]

  counts = lax.fori_loop(0, n_chunks, chunk, [jnp.zeros(thr.shape, jnp.int32)] * n_out)
  return tuple(counts) if positions else counts[0]


# ---------------------------------------------------------------------------- host side


def _prepare(embeddings, metric):
  """Validated float32 embeddings: rows L2-normalised for cosine, dims zero-padded for L1."""
  if metric not in METRICS:
    raise ValueError(f'metric must be one of {METRICS}, got {metric!r}')
  x = np.asarray(embeddings, np.float32)
  if x.ndim != 2 or x.shape[0] < 2:
    raise ValueError(f'embeddings must be [N >= 2, d], got shape {x.shape}')
  if not np.isfinite(x).all():
    raise ValueError('embeddings contain NaN or Inf')
  if metric == 'cosine':
    # Zero rows stay zero: at distance 1 from everything.
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.finfo(np.float32).tiny)
  if metric == 'cityblock':
    return np.pad(x, ((0, 0), (0, -x.shape[1] % L1_DIMS)))
  return x


def _bias(x, metric):
  """Per-item term of `_distances`: |x|^2 (euclidean), 1/2 (cosine: 1/2 + 1/2 - x.q), 0 (L1)."""
  if metric == 'euclidean':
    return np.einsum('ij,ij->i', x, x)
  return np.full(x.shape[0], 0.5 if metric == 'cosine' else 0.0, np.float32)


def _encode_labels(labels, n):
  """(names or None, [L, N] int32 dense class codes)."""
  named = isinstance(labels, Mapping)
  sets = dict(labels) if named else {None: labels}
  if not sets:
    raise ValueError('labels mapping is empty')
  codes = []
  for name, lab in sets.items():
    lab = np.asarray(lab)
    if lab.shape != (n,):
      what = f'labels {name!r}' if named else 'labels'
      raise ValueError(f'{what} must have shape ({n},) to match the items, got {lab.shape}')
    codes.append(np.unique(lab, return_inverse=True)[1].reshape(n).astype(np.int32))
  return (list(sets) if named else None), np.stack(codes)


def _plan(codes, block_size, *, odd):
  """Candidates and blocking.

  Returns cand [N, M] (each item's candidates: the union of its classes over the labelings,
  itself included, sorted, padded with N; M a multiple of CHUNK), the item order (by number
  of candidates), block size b, number of blocks nb (made odd if asked) and each block's
  number of threshold chunks.
  """
  n = codes.shape[1]
  combos, combo = np.unique(codes.T, axis=0, return_inverse=True)
  parts = []
  for l in range(codes.shape[0]):
    order = np.argsort(codes[l], kind='stable')
    sizes = np.bincount(codes[l])
    members = np.full((len(sizes), sizes.max()), n, np.int32)
    members[codes[l][order], np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes)] = order
    parts.append(members[combos[:, l]])
  table = np.sort(np.concatenate(parts, axis=1), axis=1)
  if len(parts) > 1:
    # Drop the duplicates of the union, keeping rows sorted.
    table[:, 1:][table[:, 1:] == table[:, :-1]] = n
    table = np.sort(table, axis=1)
  width = -(-(table < n).sum(axis=1).max() // CHUNK) * CHUNK
  table = np.pad(table, ((0, 0), (0, max(0, width - table.shape[1]))), constant_values=n)
  cand = table[:, :width][combo.reshape(n)]
  size = (cand < n).sum(axis=1)
  # By size, then by label combination: equal candidate sets (e.g. a writer's pages) become runs.
  order = np.lexsort((combo.reshape(n), size)).astype(np.int32)
  b = min(block_size, n)
  nb = -(-n // b)
  nb += odd and nb % 2 == 0
  largest = np.append(size[order], np.zeros(nb * b - n, int)).reshape(nb, b).max(axis=1)
  return cand, order, b, nb, (-(-largest // CHUNK)).astype(np.int32)


def _summarise(names, stats, ranks=None):
  """Metrics from the per-query sums [5, L, Q] of `_block_stats`; with its ranks [L, M, Q]
  (Q in item order), each query's AP and relevant ranks too."""
  precision, top1, hits10, hits100, n_rel = np.asarray(stats, np.float64)
  out = []
  for l in range(n_rel.shape[0]):
    keep = n_rel[l] > 0
    k = int(keep.sum())
    ap = np.where(keep, precision[l] / np.maximum(n_rel[l], 1), np.nan)
    if k == 0:
      out.append(dict(map=0.0, top1=0.0, top1_answerable=0.0, pr10=0.0, pr100=0.0,
                      num_queries=0))
    else:
      nr = n_rel[l][keep]
      out.append(dict(
          map=float(np.mean(ap[keep])),
          top1=float(np.sum(top1[l][keep]) / len(keep)),
          top1_answerable=float(np.mean(top1[l][keep])),
          pr10=float(np.mean(hits10[l][keep] / np.minimum(10, nr))),
          pr100=float(np.mean(hits100[l][keep] / np.minimum(100, nr))),
          num_queries=k))
    if ranks is not None:
      # Ascending, then the padding.
      r = np.sort(np.where(ranks[l] > 0, ranks[l], np.inf).T, axis=1)
      r = r[:, :int(n_rel[l].max(initial=0))]
      out[-1].update(ap=ap, ranks=np.nan_to_num(r, posinf=0).astype(np.int32))
  return out[0] if names is None else dict(zip(names, out))


def _check_distances(d, tol, block_size, names):
  """Raises ValueError naming the first NaN/Inf entry and the most asymmetric pair (as D[i, j],
  0-based, with the items' names when given); blockwise so no N x N temporary is made."""
  def entry(i, j):
    return f'D[{i}, {j}]' + (f' ({names[i]} -> {names[j]})' if names is not None else '')

  n = d.shape[0]
  scale = 0.0
  for s in range(0, n, block_size):
    rows = np.asarray(d[s:s + block_size], np.float64)
    if not np.isfinite(rows).all():
      i, j = np.argwhere(~np.isfinite(rows))[0]
      raise ValueError(f'distance matrix holds {rows[i, j]} at {entry(s + i, j)}; expected '
                       'finite distances (no NaN or Inf)')
    scale = max(scale, float(np.abs(rows).max()))
  limit = tol * max(scale, np.finfo(np.float32).tiny)
  for s in range(0, n, block_size):
    rows = np.asarray(d[s:s + block_size], np.float64)
    cols = np.asarray(d[:, s:s + block_size], np.float64).T
    err = np.abs(rows - cols)
    if err.max() > limit:
      i, j = np.unravel_index(np.argmax(err), err.shape)
      raise ValueError(f'distance matrix is not symmetric: {entry(s + i, j)} is '
                       f'{rows[i, j]:.9g} but D[{j}, {s + i}] is {cols[i, j]:.9g}; |D - D.T| '
                       f'reaches {err.max():.3g} > {tol:g} x max|D| = {limit:.3g}')
