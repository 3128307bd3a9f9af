"""Scores an N x N distance-matrix CSV (the format HisFrag20 accepted) against a folder.

  python -m launch.score_distances --distances D.csv --data DATA/test [--out metrics.json]

Rows and columns must name the folder's WID_PID_FID.jpg files (in any order, all of them).
Prints writer and page retrieval mAP / Top-1 / Pr@10 / Pr@100.
"""
import json
import os

import numpy as np
from absl import app, flags

DISTANCES = flags.DEFINE_string('distances', None, 'N x N distance CSV with file names.')
DATA = flags.DEFINE_string('data', None, 'Folder of the N fragments (WID_PID_FID.jpg).')
OUT = flags.DEFINE_string('out', None, 'Also write the metrics to this JSON file.')
flags.mark_flags_as_required(['distances', 'data'])


def score(distances_csv, folder):
  from retrieval import metrics, reader
  distances, names = metrics.read_distance_csv(distances_csv)
  fragments = {os.path.basename(f.path): f for f in reader.list_fragments(folder)}
  missing = [n for n in names if n not in fragments]
  if missing or len(names) != len(fragments):
    raise ValueError(f'{distances_csv}: its {len(names)} names do not match the '
                     f'{len(fragments)} fragments of {folder} (e.g. unknown: {missing[:3]})')
  writers = np.array([fragments[n].writer for n in names])
  pages = np.array([hash((fragments[n].writer, fragments[n].page)) for n in names])
  return metrics.metrics_from_distances(distances, {'writer': writers, 'page': pages})


def main(argv):
  del argv
  report = score(DISTANCES.value, DATA.value)
  print(json.dumps(report, indent=2, sort_keys=True))
  if OUT.value:
    with open(OUT.value + '.tmp', 'w') as f:
      json.dump(report, f, indent=2, sort_keys=True)
    os.replace(OUT.value + '.tmp', OUT.value)


if __name__ == '__main__':
  app.run(main)
