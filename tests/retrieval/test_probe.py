"""The k-NN probe (retrieval/fragments/probe.py), an evaluator any fragment run can name in config.evals:
in a fragments run (not MaskFeat's, whose evaluator it came from) its writer mAP equals a
direct computation from the backbone, and it runs on its own schedule."""
import json

import numpy as np
from flax import nnx
import pytest

from conftest import run_module


def average_precision(distances, labels):
  """Mean over queries with a relevant item of the AP of the ranking of all other items."""
  aps = []
  for q in range(len(labels)):
    others = np.delete(np.arange(len(labels)), q)
    ranked = others[np.argsort(distances[q, others], kind='stable')]
    relevant = labels[ranked] == labels[q]
    if relevant.any():
      hits = np.cumsum(relevant)
      aps.append(np.mean(hits[relevant] / (np.flatnonzero(relevant) + 1)))
  return np.mean(aps)


def test_the_probe_in_a_fragments_run_scores_the_backbone_as_it_is(fragment_data,
                                                                 fragment_evaluated):
  from bengrapheme import restored, evaluators
  from configs import fragments
  from retrieval.fragments import data
  from retrieval.fragments.model import preprocess
  config = fragments.get_config('test')
  config.data.dir = fragment_data
  with config.unlocked():
    config.evals.probe = dict(type='knn_probe', split='val', power=0.5)
  task, model = restored.trained_model(config, fragment_evaluated)
  probe = evaluators.make(config, task, fragment_evaluated, ['probe'])['probe']
  scores, _ = probe.run(model)

  src = data.source(config, fragment_evaluated, 'val')
  params, model_state = model.variables
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0))))
  backbone = nnx.merge(graphdef, params, model_state).backbone
  images = preprocess(src.patches()[:len(src), :, :, None], config)  # [n, S, S] on disk
  features = np.asarray(backbone(images, train=False), np.float64).mean(axis=(1, 2))
  sums = np.stack([features[a:b].sum(0) for a, b in zip(src.starts[:-1], src.starts[1:])])
  powered = np.sign(sums) * np.abs(sums) ** 0.5  # the entry's own power, not config.eval's
  descriptors = powered / np.linalg.norm(powered, axis=1, keepdims=True)
  distances = ((descriptors[:, None] - descriptors[None]) ** 2).sum(-1)
  assert scores['score'] == scores['writer']['map']
  np.testing.assert_allclose(scores['writer']['map'],
                             average_precision(distances, src.writer_ids), rtol=1e-5)
  np.testing.assert_allclose(scores['page']['map'],
                             average_precision(distances, src.page_ids), rtol=1e-5)


@pytest.mark.slow
def test_an_evaluator_runs_on_its_own_schedule(fragment_data, tmp_path):
  """val every 2 steps, test only at the last: the log says which ran when."""
  workdir = tmp_path / 'run'
  run_module('launch.train', '--config=configs/fragments.py:test', '--data', fragment_data,
             '--workdir', workdir, '--config.train.steps=4', '--config.evals.val.every=2',
             '--config.evals.test.every=4')
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  ran = {name: [row['step'] for row in rows if f'{name}/score' in row]
         for name in ('val', 'test')}
  assert ran == {'val': [2, 4], 'test': [4]}
  # test applied val's choice of the same step: val ran with it, first.
  last = {k: v for row in rows if row['step'] == 4 for k, v in row.items()}
  assert 'test/tuned/writer/map' in last and 'val/tuning/power/1.0' in last
