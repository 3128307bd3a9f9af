"""Finding the same hand through an index: the share of queries whose 10 nearest images hold
another fragment of the same writer, with the encoder, SRS-LBP, and the fused distance.

  python -m experiments.collection_hits --config configs/fragments.py:demo \
      --workdir workdirs/fragments-demo --collection data/fragments-synth/test \
      --name fragments-collection-hits --command '...' [--command ...] [--note ...]

The folder is indexed as launch.index indexes a scholar's collection (retrieval/collections/index.py:
the settings val chose for the checkpoint, into a temporary folder), then every image is
ranked against all the others through retrieval/collections/search.py, as launch.search ranks, with
three distances: the encoder's (the index's descriptors, whitened as chosen), SRS-LBP's
alone, and their fusion at the weight val chose (SGR re-ranking left out, as search leaves
it). The writers are read from the WID_PID_FID names, for scoring only; a writer's only
fragment has nothing to find and is left out. The scores are kept as a record
(experiments/records.py: test/METHOD/hit10, top1, num_queries).
"""
import argparse
import dataclasses
import importlib.util
import os
import tempfile

import numpy as np

from experiments import records
from retrieval.collections import collection, search
from retrieval.fragments import reader

METHODS = (('encoder', 0.0), ('srs_lbp', 1.0), ('fused', None))  # None: val's weight
TOP = 10


def load_config(spec):
  path, _, variant = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('config_module', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def hits(searcher, writers, among=None):
  """{hit10, top1, num_queries} over the queries whose writer has another fragment (and,
  given `among`, a bool mask of the rows, that are among those)."""
  answerable = np.bincount(writers)[writers] > 1
  if among is not None:
    answerable &= among
  hit, first = np.zeros(len(writers), bool), np.zeros(len(writers), bool)
  for start in range(0, len(writers), search.BLOCK):
    rows = np.arange(start, min(start + search.BLOCK, len(writers)))
    top, _ = searcher.nearest(searcher.descriptors[rows], searcher.lbp[rows], TOP, exclude=rows)
    same = writers[top] == writers[rows][:, None]
    hit[rows], first[rows] = same.any(axis=1), same[:, 0]
  return dict(hit10=float(hit[answerable].mean()), top1=float(first[answerable].mean()),
              num_queries=int(answerable.sum()))


def measure(config, workdir, folder):
  from bengrapheme import restored
  from retrieval.collections import index as index_lib
  _, model = restored.trained_model(config, workdir)
  with tempfile.TemporaryDirectory() as out:
    index, _ = index_lib.build(config, model, workdir, collection.list_images(folder), out)
  writers = np.array([reader.parse_name(p)[0] for p in index.entries.paths.tolist()])
  chosen = index.header['settings']
  if not chosen['fusion_weight']:
    raise SystemExit('val chose no SRS-LBP fusion for this checkpoint: the index holds no '
                     'SRS-LBP embeddings to compare')
  scores = {'settings': dict(chosen)}
  for method, weight in METHODS:
    settings = dict(chosen, fusion_weight=chosen['fusion_weight'] if weight is None else weight)
    variant = dataclasses.replace(index, header=dict(index.header, settings=settings))
    scores[method] = hits(search.Searcher.of(variant), writers)
    print(f'{method}: {scores[method]}', flush=True)
  return {'test': scores}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', required=True)
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--collection', required=True)
  parser.add_argument('--name', required=True)
  parser.add_argument('--command', action='append', required=True, dest='commands')
  parser.add_argument('--note', default='')
  args = parser.parse_args()
  commit = records.commit_of()
  scores = measure(load_config(args.config), args.workdir, args.collection)
  print(records.add(args.name, args.workdir, args.commands, commit, args.note, scores=scores))


if __name__ == '__main__':
  main()
