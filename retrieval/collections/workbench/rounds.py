"""Rounds of candidate joins: the closest pairs not yet decided, a round at a time.

Two kinds of round:
- the collection's: the closest pairs of the whole collection (retrieval/collections/search.py's
  closest_pairs, exact, every image against every other), computed once and kept beside the
  index (INDEX/candidates.npz, keyed to index.npz's size and time and the number kept), so
  that a round is a walk down that list past the decided pairs. The list is quadratic to
  compute (about 80 s for 100,000 images on 2 cores, docs/collections.md), once.
- one image's: its nearest images not yet decided with it, searched exactly at each request
  (a query against the whole index, as launch.search ranks).
"""
import json
import os

import numpy as np

from bengrapheme import console, files
from retrieval.collections import search


def candidate_pairs(folder, searcher, top):
  """[(distance, i, j)] the `top` closest pairs of the index in `folder` (rows i < j), from
  INDEX/candidates.npz when it was computed for this index.npz, else computed and kept."""
  stat = os.stat(os.path.join(folder, 'index.npz'))
  key = json.dumps(dict(size=stat.st_size, mtime_ns=stat.st_mtime_ns, top=top))
  path = os.path.join(folder, 'candidates.npz')
  if os.path.exists(path):
    with np.load(path) as z:
      if str(z['key']) == key:
        return [(float(d), int(i), int(j)) for d, i, j in zip(z['d'], z['i'], z['j'])]
  n = len(searcher.descriptors)
  console.say(f'Ranking every pair of the {n:,} images for the {top:,} closest (once; kept '
              f'in {path})')
  pairs = search.closest_pairs(searcher, top)
  d, i, j = (np.array(c) for c in zip(*pairs)) if pairs else ([], [], [])
  with files.atomic_file(path, 'wb') as f:
    np.savez(f, key=np.array(key), d=np.asarray(d, np.float32), i=np.asarray(i, np.int64),
             j=np.asarray(j, np.int64))
  return pairs


def _pair(paths, distance, rank, i, j):
  return dict(a=paths[i], b=paths[j], distance=round(float(distance), 4), rank=int(rank))


def collection_round(candidates, paths, decided, size):
  """The next `size` undecided pairs of `candidates`, closest first; rank is the pair's
  place among the collection's closest pairs (1 = the closest)."""
  out = []
  for rank, (d, i, j) in enumerate(candidates, 1):
    a, b = sorted((paths[i], paths[j]))
    if (a, b) not in decided:
      out.append(_pair(paths, d, rank, i, j))
      if len(out) == size:
        break
  return out


def image_round(searcher, paths, row, decided, size):
  """The nearest `size` images of index row `row` not yet decided with it, by an exact
  search; rank is the image's place among the row's nearest (1 = the nearest)."""
  with_row = sum(1 for pair in decided if paths[row] in pair)
  rows, dist = searcher.nearest(searcher.descriptors[[row]], searcher.lbp[[row]],
                                size + with_row, exclude=[row])
  out = []
  for rank, (j, d) in enumerate(zip(rows[0].tolist(), dist[0].tolist()), 1):
    if tuple(sorted((paths[row], paths[j]))) not in decided:
      out.append(_pair(paths, d, rank, row, j))
  return out[:size]
