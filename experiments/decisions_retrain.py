"""Learning from the workbench's decisions, on synthetic writers.

  python -m experiments.decisions_retrain --collection data/fragments-synth/test \
      --out workdirs/decisions-retrain --steps 300 --rounds 5 \
      --name decisions-retrain --command '...'

A folder of WID_PID_FID.jpg fragments is treated as a scholar's collection: the writers are
read from the names for scoring and for simulating the scholars only.
1. before: `launch.train --config configs/fragments.py:data=collection` (surrogate classes,
   no labels), indexed as launch.index indexes (retrieval/collections/index.py);
2. the scholars: the first --rounds rounds of --round-size candidate joins of that index (the
   collection's closest pairs, as launch.serve shows them) decided from the true writers
   (same writer: same hand, else different) into a workbench database (retrieval/workbench);
3. after: the same training (same seed, steps) with --config.data.decisions=that database,
   indexed again.
Scores, for each: the share of queries whose 10 nearest hold another fragment of the same
writer (experiments/collection_hits.py's hits, encoder distance), over every query and over the
queries in no decided pair. Kept as a record (experiments/records.py: before/..., after/...).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench import common
from experiments import collection_hits, records
from retrieval.collections import collection, search
from retrieval.fragments import reader
from retrieval.collections import decisions as db_lib
from retrieval.collections.workbench import rounds

CONFIG = 'configs/fragments.py:data=collection'


def train(collection_dir, workdir, steps, cache, extra=()):
  command = [sys.executable, '-m', 'launch.train', '--config', CONFIG, '--data', collection_dir,
             '--workdir', workdir, f'--config.train.steps={steps}',
             f'--config.data.cache_dir={cache}', *extra]
  print(' '.join(command[1:]), flush=True)
  subprocess.run(command, cwd=common.ROOT, check=True,
                 env=dict(os.environ, PYTHONPATH=common.ROOT))


def indexed(collection_dir, workdir):
  """(index, its searcher, the writer of each row) of the collection by the workdir's model."""
  from bengrapheme import restored
  from retrieval.collections import index as index_lib
  config = collection_hits.load_config(CONFIG)
  _, model = restored.trained_model(config, workdir)
  with tempfile.TemporaryDirectory() as out:
    index, _ = index_lib.build(config, model, workdir, collection.list_images(collection_dir),
                               out)
  writers = np.array([reader.parse_name(os.path.basename(p))[0]
                      for p in index.entries.paths.tolist()])
  return index, search.Searcher.of(index), writers


def scores(searcher, writers, decided_rows):
  """hits over every query, and over the queries in no decided pair."""
  every = collection_hits.hits(searcher, writers)
  among = np.ones(len(writers), bool)
  among[decided_rows] = False
  undecided = collection_hits.hits(searcher, writers, among)
  return dict(every, undecided_hit10=undecided['hit10'], undecided_top1=undecided['top1'],
              undecided_num_queries=undecided['num_queries'])


def simulate(index, searcher, writers, rounds_, size, db_path):
  """Decides the first rounds of the collection's closest pairs from the true writers."""
  store = db_lib.Decisions(db_path)
  e = index.entries
  pairs = search.closest_pairs(searcher, rounds_ * size)
  for rank, (d, i, j) in enumerate(pairs, 1):
    store.add(db_lib.Decision(
        a=e.paths[i], b=e.paths[j], a_size=int(e.sizes[i]), a_mtime_ns=int(e.mtimes[i]),
        b_size=int(e.sizes[j]), b_mtime_ns=int(e.mtimes[j]),
        verdict='same' if writers[i] == writers[j] else 'different', note='simulated',
        scholar='simulated from the true writers', distance=d, rank=rank,
        checkpoint=index.header['checkpoint']))
  same = sum(writers[i] == writers[j] for _, i, j in pairs)
  rows = sorted({r for _, i, j in pairs for r in (i, j)})
  return dict(pairs=len(pairs), accepted=int(same), rejected=len(pairs) - int(same)), rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--collection', required=True)
  parser.add_argument('--out', required=True, help='a folder for the two workdirs')
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--round-size', type=int, default=20)
  parser.add_argument('--name', required=True)
  parser.add_argument('--command', action='append', required=True, dest='commands')
  parser.add_argument('--note', default='')
  args = parser.parse_args()
  commit = records.commit_of()
  before, after = os.path.join(args.out, 'before'), os.path.join(args.out, 'after')
  cache = os.path.join(args.out, 'cache')
  db_path = os.path.join(args.out, 'decisions.sqlite')
  if os.path.exists(db_path):
    raise SystemExit(f'{db_path} exists: give a fresh --out')
  train(args.collection, before, args.steps, cache)
  index, searcher, writers = indexed(args.collection, before)
  decided, rows = simulate(index, searcher, writers, args.rounds, args.round_size, db_path)
  print(f'decisions: {decided}', flush=True)
  result = {'before': scores(searcher, writers, rows), 'decisions': decided}
  print(f'before: {result["before"]}', flush=True)
  train(args.collection, after, args.steps, cache, [f'--config.data.decisions={db_path}'])
  _, searcher, writers_after = indexed(args.collection, after)
  assert (writers_after == writers).all()
  result['after'] = scores(searcher, writers, rows)
  print(f'after: {result["after"]}', flush=True)
  print(records.add(args.name, args.out, args.commands, commit, args.note, scores=result))


if __name__ == '__main__':
  main()
