"""Indexing and searching a collection (launch.index, launch.search) at scale.

  python -m bench.index_scale [--quick]

- Index size: bytes per image of index.npz (64-d descriptor, 200-d SRS-LBP embedding, the
  relative path, size and time) at the largest N below, and what 350,000 fragments (the
  Cairo Genizah) would take. (The index's build rate is bench/fragment_features.py's.)
- Query latency: one query against N indexed images (10,000, 100,000, 350,000; synthetic
  descriptors), the fused distance and its 20 nearest as retrieval/collections/search.py computes them on
  the device, against the host search it replaced (bench/reference_search.py: the [1, N]
  distances of retrieval/fragments/metrics.py's kernels, z-scored, fused and ranked in numpy), in
  turns; the 20 nearest must be the same. Target at 350,000: 4x the host search. With the
  latency growing linearly in N, the row says where an exact search passes 1 s.
- Encoder only: the 64-d squared Euclidean distance alone (no fusion) and its 20 nearest at
  the largest N, against faiss's exact IndexFlatL2 (faiss-cpu, bench/requirements-bench.txt);
  the 20 nearest must be the same. Target: within 1.5x of faiss.
- Closest pairs (--query-collection): every image against every other at 100,000 (5,000
  with --quick), against the host search's blocked pairs (bench/reference_search.py),
  compiling included; the pairs must be the same. Target: 4x.
"""
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

from bench import common

SIZES = dict(full=(10_000, 100_000, 350_000), quick=(10_000, 50_000))
# Closest pairs are quadratic: 30,000 images take ~1 min a turn for both sides (100,000: ~11).
PAIRS = dict(full=30_000, quick=5_000)
GENIZAH = 350_000
INTERACTIVE_S = 1.0
TOP = 20


def synthetic_index(n, seed=0):
  """An Index of n images with random unit descriptors and SRS-LBP-like embeddings."""
  from retrieval.collections import index as index_lib
  from retrieval.features import pca
  rng = np.random.default_rng(seed)
  x = pca.l2_normalise(rng.normal(size=(n, 64)).astype(np.float32))
  lbp = pca.l2_normalise(np.sqrt(rng.gamma(0.5, size=(n, 200))).astype(np.float32))
  paths = np.array([f'box{i // 1000:03d}/folio {i}.jpg' for i in range(n)], str)
  entries = index_lib.Entries(paths, rng.integers(1e4, 1e6, n), rng.integers(1e18, 2e18, n),
                              x, lbp)
  fitted = pca.fit(rng.random((400, 3072)), 200)
  settings = dict(power=0.7, whitening_dims=0, rerank_k=0, fusion_weight=0.25)
  return index_lib.Index(dict(layout=index_lib.LAYOUT, settings=settings, step=0),
                         entries, fitted)


def bytes_per_image(n):
  from retrieval.collections import index as index_lib
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'index.npz')
    index_lib.save(path, synthetic_index(n))
    return os.path.getsize(path) / n


def latency(index, repeats):
  """(turns of 'ours' (device) and 'reference' (host), seconds to prepare the searcher):
  one query's 20 nearest, by retrieval/collections/search.py and by the host search it
  replaced."""
  from bench import reference_search
  from retrieval.collections import search
  start = time.perf_counter()
  searcher = search.Searcher.of(index)
  prepare_s = time.perf_counter() - start
  host = reference_search.Searcher(searcher)
  n = len(searcher.descriptors)
  q, lbp_q = index.entries.descriptors[n // 2][None] * 0.9, index.entries.lbp[n // 2][None]
  turns = common.interleaved(
      {'ours': lambda: searcher.nearest(q, lbp_q, TOP),
       'reference': lambda: reference_search.nearest(host.distances(q, lbp_q), TOP)},
      repeats)
  (rows, dist), (ref_rows, ref_dist) = turns['ours'][1], turns['reference'][1]
  np.testing.assert_array_equal(rows, ref_rows)
  np.testing.assert_allclose(dist, ref_dist, rtol=1e-4, atol=1e-4)
  return turns, prepare_s


def encoder_only(index, repeats):
  """Turns of 'ours' and 'faiss': one query's 20 nearest by the encoder's squared Euclidean
  distance alone, by retrieval/collections/search.py and by faiss's exact IndexFlatL2."""
  import faiss
  from retrieval.collections import search
  settings = dict(index.header['settings'], fusion_weight=0.0)
  searcher = search.Searcher.of(dataclasses.replace(index, header=dict(index.header,
                                                                       settings=settings)))
  x = index.entries.descriptors
  flat = faiss.IndexFlatL2(x.shape[1])
  flat.add(x)
  q, lbp_q = x[len(x) // 2][None] * 0.9, index.entries.lbp[:1]  # SRS-LBP unused: no fusion
  turns = common.interleaved({'ours': lambda: searcher.nearest(q, lbp_q, TOP),
                              'faiss': lambda: flat.search(q, TOP)}, repeats)
  (rows, dist), (ref_dist, ref_rows) = turns['ours'][1], turns['faiss'][1]
  np.testing.assert_array_equal(rows, ref_rows)
  (mean, std), = searcher.z  # ours are z-scored
  np.testing.assert_allclose(dist * std + mean, ref_dist, rtol=1e-4, atol=1e-4)
  return turns


def closest_pairs(n, repeats):
  """Turns of 'ours' (device) and 'reference' (host): the 20 closest pairs of n images."""
  from bench import reference_search
  from retrieval.collections import search
  searcher = search.Searcher.of(synthetic_index(n, seed=1))
  host = reference_search.Searcher(searcher)
  timed = common.interleaved(
      {'ours': lambda: search.closest_pairs(searcher, TOP),
       'reference': lambda: reference_search.closest_pairs(host, TOP)}, repeats)
  ours, ref = timed['ours'][1], timed['reference'][1]
  assert [p[1:] for p in ours] == [p[1:] for p in ref]
  np.testing.assert_allclose([p[0] for p in ours], [p[0] for p in ref], rtol=1e-4, atol=1e-4)
  return timed


def search_rows(size):
  repeats = common.MIN_REPEATS
  per_turn = lambda t: (t['ours'] * 1e3, t['reference'] * 1e3, t['reference'] / t['ours'])
  rows, per_query = [], {}
  for n in SIZES[size]:
    index = synthetic_index(n)
    turns, prepare_s = latency(index, repeats)
    at_scale = n == GENIZAH  # where the 4x target is set
    rows.append(common.timed_record(
        f'search: one query against {n:,} images', 'ms',
        'the host search it replaced (bench/reference_search.py)', turns, per_turn,
        target='>= 4x' if at_scale else f'<= {INTERACTIVE_S * 1e3:.0f} ms',
        meets=(lambda value, ratio: ratio >= 4) if at_scale else
        (lambda value, ratio: value <= INTERACTIVE_S * 1e3),
        note=f'fused 64-d encoder + 200-d SRS-LBP, 20 nearest, on the device; loading the '
             f'index and its distance statistics once: {prepare_s:.1f} s'))
    per_query[n] = rows[-1]['value'] / 1e3
  largest = max(SIZES[size])
  limit = largest * INTERACTIVE_S / per_query[largest]
  rows[-1]['note'] += (f'; linear in N, an exact query passes {INTERACTIVE_S:.0f} s at about '
                       f'{limit:,.0f} images')
  turns = encoder_only(synthetic_index(largest), repeats)
  rows.append(common.timed_record(
      f'search: encoder only, one query against {largest:,} images', 'ms',
      "faiss's exact IndexFlatL2 (faiss-cpu)", turns,
      lambda t: (t['ours'] * 1e3, t['faiss'] * 1e3, t['faiss'] / t['ours']),
      target='>= 0.67 (within 1.5x of faiss)', meets=lambda value, ratio: ratio >= 1 / 1.5,
      note='64-d squared Euclidean, 20 nearest; the same 20 as faiss'))
  pairs = PAIRS[size]
  turns = closest_pairs(pairs, repeats)
  rows.append(common.timed_record(
      f'search: closest pairs of {pairs:,} images', 's',
      "the host search's blocked pairs (bench/reference_search.py)", turns,
      lambda t: (t['ours'], t['reference'], t['reference'] / t['ours']),
      target='>= 4x', meets=lambda value, ratio: ratio >= 4,
      note='every pair ranked on the device (the first turn compiles)'))
  rows[-1]['note'] += (f'; quadratic: 350,000 would take about '
                       f'{rows[-1]["value"] * (GENIZAH / pairs) ** 2 / 3600:,.1f} h')
  return rows


def run(quick):
  size = 'quick' if quick else 'full'
  largest = max(SIZES[size])
  index_bytes = bytes_per_image(largest)
  rows = [common.record(
      'index: bytes per fragment', index_bytes, 'bytes', None, None, ratio=None,
      note=f'index.npz of {largest:,} images; at 350,000 fragments: '
           f'{index_bytes * GENIZAH / 1e6:,.0f} MB')]
  return rows + search_rows(size)


if __name__ == '__main__':
  sys.exit(common.main(__doc__, run))
