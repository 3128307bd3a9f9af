"""Scores an N x N distance-matrix CSV (the format HisFrag20 accepted) against a folder.

  python -m launch.score_distances --distances D.csv --data DATA/test [--out metrics.json]

Rows and columns must name the folder's WID_PID_FID.jpg files (in any order, all of them).
Prints writer and page retrieval mAP / Top-1 / Pr@10 / Pr@100. A bad matrix is an error
naming the file and the row, column or name at fault; --out is then not written.
"""
import json
import os

import numpy as np
from absl import flags, logging

from bengrapheme import errors, files
from launch import cli

DISTANCES = flags.DEFINE_string('distances', None, 'N x N distance CSV with file names.')
DATA = flags.DEFINE_string('data', None, 'Folder of the N fragments (WID_PID_FID.jpg).')
OUT = flags.DEFINE_string('out', None, 'Also write the metrics to this JSON file.')
flags.mark_flags_as_required(['distances', 'data'])


def score(distances_csv, folder):
  from retrieval.fragments import distances_io, metrics, reader
  distances, names = distances_io.read_distance_csv(distances_csv)
  fragments = {os.path.basename(f.path): f for f in reader.list_fragments(folder)}
  unknown = [n for n in names if n not in fragments]
  if unknown:
    raise ValueError(f'{distances_csv}: {unknown[0]!r} is not a fragment of {folder} '
                     f'(names not in the folder: {len(unknown)}); expected the names of its '
                     f'{len(fragments)} WID_PID_FID.jpg files')
  absent = sorted(set(fragments) - set(names))
  if absent:
    raise ValueError(f'{distances_csv}: no row for {absent[0]!r} of {folder} (fragments '
                     f'without a row: {len(absent)}); expected all {len(fragments)} fragments')
  writers = np.array([fragments[n].writer for n in names])
  pages = np.array([hash((fragments[n].writer, fragments[n].page)) for n in names])
  try:
    return metrics.metrics_from_distances(distances, {'writer': writers, 'page': pages},
                                          item_names=names)
  except ValueError as e:
    raise ValueError(f'{distances_csv}: {e}') from e


def run(distances_csv, folder, out=None):
  """Scores the matrix; writes `out` (whole, or not at all) when given; returns the report."""
  report = score(distances_csv, folder)
  if out:
    files.write_atomic(out, json.dumps(report, indent=2, sort_keys=True))
  return report


def main(argv):
  del argv
  # JAX logs its search for a TPU at INFO ("Unable to initialize backend 'tpu'") on every CPU
  # machine; absl shows INFO under app.run.
  logging.set_verbosity(logging.WARNING)
  try:
    report = run(DISTANCES.value, DATA.value, OUT.value)
  except ValueError as e:  # every check of the matrix and folder says what is wrong with them
    raise errors.UserError(str(e)) from e
  print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == '__main__':
  cli.run(main)
