"""Searching an index (launch.search): the nearest images of a query, or of every image.

The distance is the evaluator's for the settings the index holds (retrieval/evaluate.py):
PCA-whitening fitted on the indexed descriptors themselves (as eval.whitening='self'), the
encoder's squared Euclidean distance, and with SRS-LBP fusion (1 - w) z(encoder) + w z(SRS-LBP),
z normalising each distance by its mean and standard deviation over pairs of the collection
(all of them up to Z_PAIRS, else a seeded sample of that many). SGR re-ranking is not applied:
it rebuilds every item's neighbourhood from every pair of the collection.

Distances are computed exactly, a block of queries against every item at once
(retrieval/metrics.py's kernels); bench/index_scale.py measures how far that stays
interactive.
"""
import dataclasses
import json
import os

import ml_collections
import numpy as np
from PIL import Image

from bengrapheme import errors, eval_only, files, report
from retrieval import collection, index as index_lib, metrics, pca

Z_PAIRS = 200_000
BLOCK = 256  # queries a kernel call ranks at once
THUMB = 200  # px: the longest side of the largest image a page shows


@dataclasses.dataclass
class Searcher:
  """The collection's vectors, prepared once for any number of queries."""
  descriptors: np.ndarray  # float32 [N, D] (whitened when the settings say so)
  lbp: np.ndarray  # float32 [N, L]
  whitening: pca.PCA | None
  weight: float  # SRS-LBP fusion weight
  z: tuple  # (mean, std) of the encoder's and of SRS-LBP's distances over pairs
  encoder_kernel: metrics.Against  # the vectors above, on the device
  lbp_kernel: metrics.Against | None

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
    weight = float(s['fusion_weight'])
    searcher = Searcher(x, index.entries.lbp, whitening, weight, (),
                        metrics.Against(x), metrics.Against(index.entries.lbp,
                                                            metric='cityblock') if weight else None)
    searcher.z = searcher._pair_statistics(seed)
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


# ------------------------------------------------------------------ the page


def load_display(path):
  return Image.fromarray(collection.open_rgba(path))


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
          'Distances: lower is closer (z-normalised; retrieval/search.py).')


def _write(out, title, intro, groups):
  files.write_atomic(out, page(title, intro, groups))


def _query_vectors(workdir, index, searcher, paths):
  """Descriptors and SRS-LBP rows of images outside the index, embedded as the index was."""
  config = ml_collections.ConfigDict(json.loads(index.header['config']))
  _, model = eval_only.trained_model(config, workdir)
  if model.step != index.header['step']:
    raise errors.UserError(
        f'the index was built with the checkpoint of step {index.header["step"]:,}; the '
        f'newest in {workdir} is step {model.step:,}: rerun launch.index to rebuild it')
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
    descriptors[outside], lbp_rows[outside] = _query_vectors(
        workdir, index, searcher, [queries[k] for k in outside])
  exclude = [r if r >= 0 and k not in outside else -1 for k, r in enumerate(own)]
  rows, dist = nearest(searcher.distances(descriptors, lbp_rows, exclude), top)
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
