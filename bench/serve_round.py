"""The workbench (launch.serve) serving a round of 20 candidate joins, as a scholar waits
for it: the HTTP request to the app on 127.0.0.1, answered and read back.

  python -m bench.serve_round [--quick]

The index is bench/index_scale.py's synthetic one (64-d descriptors, 200-d SRS-LBP fused at
0.25, the real index.npz format, written and loaded as launch.serve loads it), with a
decisions database that already holds decisions, so that each round walks past decided
pairs:

- one image's round: its 20 nearest images not yet decided with it, an exact search of the
  whole index at each request (retrieval/collections/workbench/rounds.py image_round); 10,000 and
  350,000 images (the Cairo Genizah's size). Targets: 200 ms at 10,000, 1 s at 350,000.
- the collection's round: the next 20 of its closest pairs not yet decided, from the list
  ranked once when the app starts (exact, every pair; its time is in the note); 10,000
  images, target 200 ms. At 350,000 that ranking is quadratic (bench/index_scale.py's
  closest-pairs row: about 0.3 h on 2 cores), so it is not run here; a round then walks the
  same kind of list.
Each figure is the median of its repeats; the rounds are checked against the searcher.
"""
import json
import os
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np

from bench import common, index_scale

SIZES = dict(full=(10_000, 350_000), quick=(10_000, 50_000))
TARGET_MS = {10_000: 200, 50_000: 1000, 350_000: 1000}
ROUND = 20
DECIDED = 500  # decisions already in the database


def serve(folder, root, db):
  import uvicorn
  import threading
  from retrieval.collections.workbench import app as app_lib
  settings = app_lib.Settings(workdir=root, folder=folder, db=db, round_size=ROUND)
  app = app_lib.create(settings)
  server = uvicorn.Server(uvicorn.Config(app, host='127.0.0.1', port=0, log_level='warning'))
  thread = threading.Thread(target=server.run, daemon=True)
  thread.start()
  while not server.started:
    time.sleep(0.01)
  port = server.servers[0].sockets[0].getsockname()[1]
  return app.state.workbench, server, f'http://127.0.0.1:{port}'


def fetch(url):
  with urllib.request.urlopen(url, timeout=600) as response:
    return json.loads(response.read())


def decide(bench, pairs, anchor_pairs):
  """Keeps decisions on `pairs` [(a, b)] straight into the database, as the app would."""
  from retrieval.collections import decisions as db_lib
  for a, b in list(pairs) + list(anchor_pairs):
    bench.decisions.add(db_lib.Decision(a=a, b=b, a_size=1, a_mtime_ns=1, b_size=1,
                                        b_mtime_ns=1, verdict='different', note='',
                                        scholar='bench', distance=None, rank=None,
                                        checkpoint=''))


def measure(n, repeats, collection_round):
  from retrieval.collections import index as index_lib
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.join(tmp, 'index')
    os.makedirs(folder)
    index = index_scale.synthetic_index(n)
    index.header.update(root=tmp, checkpoint='bench')
    index_lib.save(os.path.join(folder, 'index.npz'), index)
    start = time.perf_counter()
    bench, server, address = serve(folder, tmp, os.path.join(tmp, 'decisions.sqlite'))
    load_s = time.perf_counter() - start
    paths = bench.paths
    anchor = n // 2
    s = bench.searcher
    near, _ = s.nearest(s.descriptors[[anchor]], s.lbp[[anchor]], ROUND + 5, exclude=[anchor])
    anchor_decided = [(paths[anchor], paths[j]) for j in near[0][:5]]
    ranked_s, decided = None, []
    if collection_round:
      start = time.perf_counter()
      candidates = bench.candidates()
      ranked_s = time.perf_counter() - start
      decided = [(paths[i], paths[j]) for _, i, j in candidates[:DECIDED]]
    decide(bench, [tuple(sorted(p)) for p in decided],
           [tuple(sorted(p)) for p in anchor_decided])
    image_url = f'{address}/api/round?path={urllib.parse.quote(paths[anchor])}'
    timed = common.interleaved({'image': lambda: fetch(image_url)} | (
        {'collection': lambda: fetch(f'{address}/api/round')} if collection_round else {}),
        repeats)
    server.should_exit = True
    got = [p['b'] for p in timed['image'][1]['pairs']]
    assert got == [paths[j] for j in near[0][5:5 + ROUND]], 'image round: not the nearest'
    note = (f'synthetic index.npz loaded and searcher prepared in {load_s:.1f} s; '
            f'{DECIDED + 5 if collection_round else 5} decisions in the database')
    within = lambda value, ratio: value <= TARGET_MS[n]
    rows.append(common.timed_record(
        f"workbench: one image's round of {ROUND} candidate joins, {n:,} images", 'ms', None,
        timed, lambda t: (t['image'] * 1e3, None, None), target=f'<= {TARGET_MS[n]:,} ms',
        meets=within, note='an exact search of every image at each request, the 5 '
        'decided with it left out, over HTTP on 127.0.0.1; ' + note))
    if collection_round:
      pairs = timed['collection'][1]['pairs']
      assert [(paths[i], paths[j]) for _, i, j in candidates[DECIDED:DECIDED + ROUND]] == \
          [(p['a'], p['b']) for p in pairs], 'collection round: not the next closest pairs'
      rows.append(common.timed_record(
          f"workbench: the collection's round of {ROUND} closest undecided pairs, {n:,} images",
          'ms', None, timed, lambda t: (t['collection'] * 1e3, None, None),
          target=f'<= {TARGET_MS[n]:,} ms', meets=within, note=f'its {len(candidates):,} closest pairs ranked once at start '
          f'(exact, every pair, on the device): {ranked_s:.1f} s; the round walks past the '
          f'{DECIDED} decided first; ' + note))
  return rows


def run(quick):
  size = 'quick' if quick else 'full'
  repeats = common.MIN_REPEATS if quick else 10
  rows = []
  for n in SIZES[size]:
    print(f'serve_round: {n:,} images', file=sys.stderr, flush=True)
    rows += measure(n, repeats, collection_round=n == min(SIZES[size]))
  return rows


if __name__ == '__main__':
  sys.exit(common.main(__doc__, run))
