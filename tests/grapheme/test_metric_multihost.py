"""Hierarchical macro recall counted on the devices of a 2-process job (launch.local).

Each process reads its half of every global batch through the eval loop
(inference.outputs_by_row with sums); the confusion matrices its jitted step adds up are
the sum over both processes, so both score all rows as sklearn does, padding rows left out.
Run as a module, this file is one process of that job.
"""
import json
import re
import types

import numpy as np

from bengrapheme import inference, parallel
from bengrapheme.grapheme import metrics

ROWS = 1000  # 500 a process: its last local batch of 32 holds 12 padding rows
BATCH = 128  # global: 2 processes x 2 devices x 32


def labels():
  """(y_true, y_pred) [ROWS, 3], the same in every process: mostly right predictions, and
  classes that only the truth or only the predictions hold."""
  rng = np.random.default_rng(0)
  draw = lambda n: np.stack([rng.integers(0, c, n) for c in metrics.NUM_CLASSES], 1)
  y_true = draw(ROWS)
  return y_true, np.where(rng.random((ROWS, 3)) < 0.7, y_true, draw(ROWS))


class Source:
  """The predictions stand in for images: the identity model passes them through."""

  def __init__(self, y_true, y_pred):
    self.y_true, self.y_pred = y_true.astype(np.int32), y_pred.astype(np.int32)

  def __len__(self):
    return len(self.y_true)

  def __getitem__(self, i):
    return dict(image=self.y_pred[i], labels=self.y_true[i], index=np.int32(i))


def main():
  parallel.initialize_distributed()
  mesh = parallel.make_mesh(types.SimpleNamespace(data=-1, fsdp=1))
  model = inference.TrainedModel(apply=lambda variables, images: images, variables={},
                                  mesh=mesh, step=0)

  def predict(forward, batch):
    predicted = forward(batch['image'])
    return ({'predictions': predicted},
            metrics.confusion_on_device(batch['labels'], predicted, batch['mask']))

  sums = [np.zeros((c, c), np.int32) for c in metrics.NUM_CLASSES]
  _, confusion = inference.outputs_by_row(model, predict, Source(*labels()), batch_size=BATCH,
                                           keys=('image', 'labels'), sums=sums)
  print('scores', json.dumps(metrics.from_confusion(confusion)), flush=True)


def test_two_processes_score_all_rows():
  from conftest import run_module
  from test_macro_recall import assert_same, sklearn_scores
  result = run_module('launch.local', '--processes', '2', '--devices-per-process', '2', '--',
                      'tests.grapheme.test_metric_multihost', timeout=300)
  scores = {int(i): json.loads(s) for i, s in re.findall(r'\[(\d)\] scores (.*)', result.stdout)}
  assert sorted(scores) == [0, 1], result.stdout[-3000:] + result.stderr[-3000:]
  y_true, y_pred = labels()
  assert scores[0] == scores[1] == metrics.hierarchical_macro_recall(y_true, y_pred)
  assert_same(scores[0], sklearn_scores(y_true, y_pred))


if __name__ == '__main__':
  main()
