"""Searching an index (launch.search): the nearest images of a query, or of every image.

The distance is the evaluator's for the settings the index holds (retrieval/fragments/evaluate.py):
PCA-whitening fitted on the indexed descriptors themselves (as eval.whitening='self'), the
encoder's squared Euclidean distance, and with SRS-LBP fusion (1 - w) z(encoder) + w z(SRS-LBP),
z normalising each distance by its mean and standard deviation over pairs of the collection
(all of them up to Z_PAIRS, else a seeded sample of that many). SGR re-ranking is not applied:
it rebuilds every item's neighbourhood from every pair of the collection.

Distances are computed exactly, on the device: the index's vectors are placed there once, laid
out for the kernels, and one jitted call takes a block of queries against every item, leaves
out each query's own row and ranks them (lax.top_k), so that only the k nearest of each query
come back to the host, never the [queries, N] distances. The closest pairs of the collection
are a running top-k over blocks of rows, also on the device. Among equal distances the lower
row ranks first. bench/index_scale.py measures how far that stays interactive, against the
host search these replaced (bench/reference_search.py).
"""
import dataclasses
import functools
import json
import os
import typing

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax import lax
from PIL import Image

from bengrapheme import errors, restored, files, report
from retrieval.collections import collection, index as index_lib
from retrieval.fragments import metrics
from retrieval.features import pca

Z_PAIRS = 200_000
BLOCK = 256  # the most queries a kernel call ranks at once
# Closest pairs: a block of rows meets only the columns from its start rounded down to a part
# boundary, which skips most pairs j < i. Each part is a shape compiled once (about 1 s on 2
# cores): at most PARTS of them, at least MIN_SPAN columns apart.
PARTS, MIN_SPAN = 8, 16_384
THUMB = 200  # px: the longest side of the largest image a page shows


class Items(typing.NamedTuple):
  """The collection on the device, laid out for the kernels (a pytree: one jit argument)."""
  x: jax.Array  # float32 [N, D] descriptors
  norms: jax.Array  # float32 [N] |x|^2
  lbp: jax.Array | None  # float32 [L / L1_DIMS, L1_DIMS, N] SRS-LBP rows; None: no fusion
  z: jax.Array  # float32 [1 or 2, 2]: (mean, std) of the encoder's, SRS-LBP's distances
  weights: jax.Array  # float32 [2]: (1 - w, w)


@dataclasses.dataclass
class Searcher:
  """The collection's vectors, prepared once for any number of queries."""
  descriptors: np.ndarray  # float32 [N, D] (whitened when the settings say so)
  lbp: np.ndarray  # float32 [N, L]
  whitening: pca.PCA | None
  weight: float  # SRS-LBP fusion weight
  z: tuple  # (mean, std) of the encoder's and of SRS-LBP's distances over pairs
  items: Items  # the vectors above, on the device

  @staticmethod
  def of(index, seed=0):
    if len(index.entries.paths) < 2:
      raise errors.UserError(f'the index holds {len(index.entries.paths)} image; a search needs '
                             'two or more')
    s = index.header['settings']
    x, whitening = index.entries.descriptors, None
    if s['whitening_dims']:
      dims = min(s['whitening_dims'], len(x) - 1, x.shape[1])
      whitening = pca.fit(x, dims, whiten=True)
      x = pca.l2_normalise(pca.project(whitening, x))
    x = np.asarray(x, np.float32)
    searcher = Searcher(x, index.entries.lbp, whitening, float(s['fusion_weight']), (), None)
    searcher.z = searcher._pair_statistics(seed)
    searcher.items = Items(
        jnp.asarray(x), jnp.asarray(_norms(x)),
        jnp.asarray(_dims_outermost(searcher.lbp)) if searcher.weight else None,
        jnp.asarray(searcher.z, jnp.float32),
        # rounded to float32 once, as numpy's float32 arithmetic takes a Python float
        jnp.asarray([1 - searcher.weight, searcher.weight], jnp.float32))
    return searcher

  def _pair_statistics(self, seed):
    n = len(self.descriptors)
    if n * (n - 1) <= Z_PAIRS:
      i, j = np.nonzero(~np.eye(n, dtype=bool))
    else:
      rng = np.random.default_rng(seed)
      i, j = rng.integers(0, n, Z_PAIRS), rng.integers(0, n - 1, Z_PAIRS)
      j += j >= i  # never an item with itself
    def stats(x, power):  # in slices: 200k pairs of 200-d rows would hold 320 MB at once
      d = np.concatenate([(np.abs(x[i[s:s + 20000]] - x[j[s:s + 20000]]) ** power).sum(1)
                          for s in range(0, len(i), 20000)])
      return float(d.mean()), max(float(d.std()), 1e-12)

    return (stats(self.descriptors, 2),) + ((stats(self.lbp, 1),) if self.weight else ())

  def query_vectors(self, descriptors, lbp_rows):
    """Descriptors and SRS-LBP rows of images embedded outside the index, made comparable."""
    if self.whitening is not None:
      descriptors = pca.l2_normalise(pca.project(self.whitening, descriptors))
    return np.asarray(descriptors, np.float32), np.asarray(lbp_rows, np.float32)

  def nearest(self, q_descriptors, q_lbp, top, exclude=None):
    """(rows [Q, k], distances [Q, k]) of each query's k nearest items, in order: k =
    min(top, N - 1) when some query excludes its own row (exclude[q] >= 0: that row is at
    +inf, a query does not find itself), else min(top, N)."""
    q = np.asarray(q_descriptors, np.float32)
    q_lbp = np.asarray(q_lbp, np.float32)
    own = np.full(len(q), -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
    n = len(self.descriptors)
    k = min(top, n - 1) if (own >= 0).any() else min(top, n)
    found = []
    for s in range(0, len(q), BLOCK):
      e = min(s + BLOCK, len(q))
      size = min(BLOCK, 1 << (e - s - 1).bit_length())  # a few shapes, each compiled once
      block = _ranked(self.items, _padded(q[s:e], size), _padded(_norms(q[s:e]), size),
                      _dims_outermost(_padded(q_lbp[s:e], size)) if self.weight else None,
                      _padded(own[s:e], size, -1), k=k)
      found.append([np.asarray(a)[:e - s] for a in block])
    return tuple(map(np.concatenate, zip(*found)))


def closest_pairs(searcher, top):
  """The `top` closest pairs (i < j) of the collection, [(distance, i, j)] by distance, then
  i, then j: every item ranked against every later one a block of rows at a time, merged
  into a running top-k on the device."""
  items, n = searcher.items, len(searcher.descriptors)
  best = (jnp.full(top, jnp.inf), jnp.full(top, -1, jnp.int32), jnp.full(top, -1, jnp.int32))
  span = -(-max(MIN_SPAN, -(-n // PARTS)) // BLOCK) * BLOCK
  first, columns = None, None
  for start in range(0, n, BLOCK):
    if start // span * span != first:
      first = start // span * span
      columns = items._replace(x=items.x[first:], norms=items.norms[first:],
                               lbp=None if items.lbp is None else items.lbp[..., first:])
    best = _pairs_block(items, columns, first, start, best)
  d, i, j = map(np.asarray, best)
  keep = np.isfinite(d)
  return [(float(dist), int(a), int(b)) for dist, a, b in zip(d[keep], i[keep], j[keep])]


# ------------------------------------------------------------------ the kernels


def _padded(a, size, value=0):
  """`a` with rows of `value` appended up to `size` rows: a query block's fixed shape."""
  return np.pad(a, [(0, size - len(a))] + [(0, 0)] * (a.ndim - 1), constant_values=value)


def _norms(x):
  return np.einsum('ij,ij->i', x, x)  # as retrieval/fragments/metrics.py's kernels take them


def _dims_outermost(rows):
  """[R, L] -> [L' / L1_DIMS, L1_DIMS, R], L' = L zero-padded to a multiple of L1_DIMS: the
  L1 kernel scans L1_DIMS dims at a time, each a contiguous run over the rows."""
  rows = np.pad(rows, ((0, 0), (0, -rows.shape[1] % metrics.L1_DIMS)))
  return rows.T.reshape(-1, metrics.L1_DIMS, rows.shape[0])


def _fused(items, q, q_norms, q_lbp):
  """[Q, N] fused distances of queries to every item."""
  enc = (q_norms[:, None] + items.norms[None, :]) - 2.0 * (q @ items.x.T)
  d = (enc - items.z[0, 0]) / items.z[0, 1]
  if items.lbp is None:
    return d

  def step(acc, dims):
    xs, qs = dims
    for k in range(metrics.L1_DIMS):  # unrolled adds fuse into one loop, as in metrics.py
      acc = acc + jnp.abs(qs[k][:, None] - xs[k][None, :])
    return acc, None

  l1, _ = lax.scan(step, jnp.zeros(d.shape, jnp.float32), (items.lbp, q_lbp))
  return items.weights[0] * d + items.weights[1] * ((l1 - items.z[1, 0]) / items.z[1, 1])


@functools.partial(jax.jit, static_argnames='k')
def _ranked(items, q, q_norms, q_lbp, exclude, *, k):
  """(rows, distances) [Q, k] of the queries' k nearest; exclude[q] >= 0 is left out."""
  d = _fused(items, q, q_norms, q_lbp)
  d = jnp.where(jnp.arange(d.shape[1])[None, :] == exclude[:, None], jnp.inf, d)
  neg, rows = lax.top_k(-d, k)  # equal distances: the lower row first
  return rows, -neg


@jax.jit
def _pairs_block(items, columns, first, start, best):
  """The running best (distances, i, j) [top], merged with the pairs (i, j > i) of rows
  start .. start + BLOCK - 1 and columns first .. N - 1 (the Items `columns`)."""
  top = best[0].shape[0]
  i = start + jnp.arange(BLOCK)
  rows = jnp.minimum(i, items.x.shape[0] - 1)
  q_lbp = None if items.lbp is None else items.lbp[:, :, rows]
  d = _fused(columns, items.x[rows], items.norms[rows], q_lbp)
  j = first + jnp.arange(d.shape[1])
  d = jnp.where(j[None, :] > i[:, None], d, jnp.inf)  # rows past the end have no j > i
  # Each row's best first: a block's best pairs are among them. Flattened row by row, equal
  # distances stay ordered by i, then j, as top_k keeps the lower position first.
  neg, col = lax.top_k(-d, min(top, d.shape[1]))
  neg, pick = lax.top_k(neg.ravel(), min(top, neg.size))
  found = (-neg, i[pick // col.shape[1]], j[col.ravel()[pick]])
  # The running best holds earlier rows: first among equal distances.
  merged = [jnp.concatenate(pair) for pair in zip(best, found)]
  neg, pick = lax.top_k(-merged[0], top)
  return tuple(m[pick] for m in merged)


# ------------------------------------------------------------------ the page


def load_display(path):
  """The image as drawn on the page; a file moved, removed or damaged since it was indexed
  is named with what to do."""
  try:
    return Image.fromarray(collection.open_rgba(path))
  except FileNotFoundError:
    why = 'no such file (moved or removed since it was indexed)'
  except collection.ERRORS as e:
    why = f'unreadable image ({e}; changed since it was indexed?)'
  raise errors.UserError(f'{path}: {why}; rerun python -m launch.index on its folder to bring '
                         'the index up to date')


def _figure(image, scale, colour, caption):
  w, h = image.size
  shown = image.resize((max(8, round(w * scale)), max(8, round(h * scale))),
                       Image.Resampling.LANCZOS)
  return report.tag('figure', report.png(shown, alt=caption, title=caption,
                                         style=f'border: 3px solid {colour}'),
                    report.tag('figcaption', caption))


def page(title, intro, groups):
  """A self-contained HTML page: `groups` is a list of (heading, [(path, caption, colour)]),
  every image drawn at one scale, so that sizes compare across the page."""
  images = {p: load_display(p) for _, items in groups for p, _, _ in items}
  largest = max(max(image.size) for image in images.values())
  scale = min(1.0, THUMB / largest)
  body = [report.note(intro),
          report.note(f'Every image is drawn at {scale:.0%} of its size in pixels, so that '
                      'sizes compare.')]
  for heading, items in groups:
    body += [report.tag('h3', heading),
             report.row(*[_figure(images[p], scale, colour, caption)
                          for p, caption, colour in items])]
  return report.page(title, *body)


def relative_or_full(path, root):
  path = os.path.abspath(path)
  inside = os.path.commonpath([path, root]) == root
  return os.path.relpath(path, root).replace(os.sep, '/') if inside else path


# ------------------------------------------------------------------ the commands

QUERY_COLOUR, MATCH_COLOUR = '#1f77b4', '#999999'


def _intro(folder, index):
  h = index.header
  settings = ', '.join(f'{k} {v}' for k, v in h['settings'].items() if k != 'rerank_k')
  skipped = (f' (SGR re-ranking, k={h["settings"]["rerank_k"]}, not applied: it needs every '
             'pair)' if h['settings']['rerank_k'] else '')
  return (f'Index {folder}: {len(index.entries.paths):,} images of {h["root"]}, checkpoint '
          f'step {h["step"]:,}, settings chosen on {h["chosen_on"]}: {settings}{skipped}. '
          'Distances: lower is closer (z-normalised; retrieval/collections/search.py).')


def _write(out, title, intro, groups):
  files.write_atomic(out, page(title, intro, groups))


def query_model(workdir, index):
  """(config, model) the index was built with: the newest checkpoint of `workdir`, refused
  when it is not the one the index's descriptors came from."""
  config = ml_collections.ConfigDict(json.loads(index.header['config']))
  _, model = restored.trained_model(config, workdir)
  built_with = index.header.get('checkpoint')
  if built_with != index_lib.checkpoint_digest(model):
    raise errors.UserError(
        f'the index was built with another checkpoint (step {index.header["step"]:,}, '
        f'{built_with or "from before checkpoints were identified"}) than the newest in '
        f'{workdir} (step {model.step:,}): rerun launch.index to rebuild it')
  return config, model


def query_vectors(config, model, index, searcher, paths):
  """Descriptors and SRS-LBP rows of images outside the index, embedded as the index was
  (config and model from query_model)."""
  found, problems = {}, []

  def keep(rows, entries, messages):
    problems.extend(messages)
    for k, r in enumerate(rows):
      found[r] = (entries.descriptors[k], entries.lbp[k])

  index_lib.embed(config, model, index.header['settings'], index.lbp_pca,
                  [(p, os.path.basename(p)) for p in paths], keep)
  if problems:
    raise errors.UserError(f'query {problems[0]}')
  descriptors = np.stack([found[r][0] for r in range(len(paths))])
  lbp_rows = np.stack([found[r][1] for r in range(len(paths))])
  return searcher.query_vectors(descriptors, lbp_rows)


def search_files(workdir, folder, queries, top, out):
  """Ranks the collection for each query file; writes the page to `out`; returns the text."""
  index = index_lib.load(os.path.join(folder, 'index.npz'))
  root, entries = index.header['root'], index.entries
  for q in queries:
    if not os.path.isfile(q):
      raise errors.UserError(f'{q}: no such file; expected a query image')
  searcher = Searcher.of(index)
  row_of = {p: r for r, p in enumerate(entries.paths.tolist())}
  own, notes = [], []
  for q in queries:
    name = relative_or_full(q, root)
    r = row_of.get(name, -1)
    stat = os.stat(q)
    if r >= 0 and (entries.sizes[r], entries.mtimes[r]) != (stat.st_size, stat.st_mtime_ns):
      r = -1  # changed since it was indexed: embedded afresh, and still not its own match
      notes.append(f'{q} changed since it was indexed: embedded afresh (rerun launch.index)')
    elif r < 0 and not os.path.isabs(name):
      notes.append(f'{q} is in the collection folder but not in the index (rerun launch.index '
                   'to add it)')
    own.append(r)
  descriptors = np.zeros((len(queries), searcher.descriptors.shape[1]), np.float32)
  lbp_rows = np.zeros((len(queries), searcher.lbp.shape[1]), np.float32)
  for k, r in enumerate(own):
    if r >= 0:
      descriptors[k], lbp_rows[k] = searcher.descriptors[r], searcher.lbp[r]
  outside = [k for k, r in enumerate(own) if r < 0]
  if outside:
    descriptors[outside], lbp_rows[outside] = query_vectors(
        *query_model(workdir, index), index, searcher, [queries[k] for k in outside])
  exclude = [r if r >= 0 and k not in outside else -1 for k, r in enumerate(own)]
  rows, dist = searcher.nearest(descriptors, lbp_rows, top, exclude)
  lines, groups = list(notes), []
  for k, q in enumerate(queries):
    where = 'in the collection' if own[k] >= 0 else 'outside the collection'
    lines.append(f'\nQuery {q} ({where}): the {rows.shape[1]} nearest')
    lines += [f'{rank:>4}. {d:8.3f}  {entries.paths[j]}'
              for rank, (j, d) in enumerate(zip(rows[k], dist[k]), 1)]
    groups.append((f'{q} ({where})', [(q, 'query', QUERY_COLOUR)] + [
        (os.path.join(root, entries.paths[j]), f'{rank}. {d:.3f} {entries.paths[j]}',
         MATCH_COLOUR) for rank, (j, d) in enumerate(zip(rows[k], dist[k]), 1)]))
  _write(out, f'Search: {len(queries)} quer{"y" if len(queries) == 1 else "ies"}',
         _intro(folder, index), groups)
  return '\n'.join(lines)


def search_collection(folder, top, out):
  """The `top` closest pairs of the collection; writes the page to `out`; returns the text."""
  index = index_lib.load(os.path.join(folder, 'index.npz'))
  root, paths = index.header['root'], index.entries.paths
  pairs = closest_pairs(Searcher.of(index), top)
  lines = [f'The {len(pairs)} closest pairs of {len(paths):,} images:']
  lines += [f'{rank:>4}. {d:8.3f}  {paths[i]}  <->  {paths[j]}'
            for rank, (d, i, j) in enumerate(pairs, 1)]
  groups = [(f'{rank}. distance {d:.3f}',
             [(os.path.join(root, paths[i]), paths[i], QUERY_COLOUR),
              (os.path.join(root, paths[j]), paths[j], QUERY_COLOUR)])
            for rank, (d, i, j) in enumerate(pairs, 1)]
  _write(out, f'The {len(pairs)} closest pairs', _intro(folder, index) +
         ' Candidate joins: every image ranked against every other.', groups)
  return '\n'.join(lines)
