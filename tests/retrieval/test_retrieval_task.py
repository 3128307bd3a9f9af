"""The fragment task: losses against numpy references, P x K batches, the CLIs end to end."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import run_module
from retrieval.fragments import data, losses as losses_lib, model as model_lib, reader


def normalised(rng, n, d):
  x = rng.normal(size=(n, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def batch_hard_reference(x, labels, margin):
  d = np.sqrt(np.maximum(((x[:, None] - x[None]) ** 2).sum(-1), 0))
  losses = []
  for a in range(len(x)):
    pos = [d[a, p] for p in range(len(x)) if p != a and labels[p] == labels[a]]
    neg = [d[a, n] for n in range(len(x)) if labels[n] != labels[a]]
    if pos and neg:
      gap = max(pos) - min(neg)
      losses.append(np.log1p(np.exp(gap)) if margin is None else max(gap + margin, 0.0))
  return np.mean(losses)


@pytest.mark.parametrize('margin', [None, 0.2, 1.0])
def test_batch_hard_triplet_loss_matches_numpy(margin):
  rng = np.random.default_rng(0)
  x = normalised(rng, 24, 8)
  labels = np.repeat(np.arange(6), 4)
  labels[-1] = 99  # a singleton anchor: no positive, left out
  got = losses_lib.batch_hard_triplet_loss(jnp.asarray(x), jnp.asarray(labels), margin)
  np.testing.assert_allclose(float(got), batch_hard_reference(x, labels, margin), rtol=1e-4,
                             atol=1e-5)


def test_multi_similarity_loss_matches_numpy():
  rng = np.random.default_rng(1)
  x = normalised(rng, 16, 8)
  labels = np.repeat(np.arange(4), 4)
  s = x @ x.T
  alpha, beta, lam, eps = 2.0, 50.0, 0.5, 0.1
  losses = []
  for a in range(16):
    pos = [s[a, p] for p in range(16) if p != a and labels[p] == labels[a]]
    neg = [s[a, n] for n in range(16) if labels[n] != labels[a]]
    pos_kept = [v for v in pos if v - eps < max(neg)]
    neg_kept = [v for v in neg if v + eps > min(pos)]
    losses.append(np.log1p(sum(np.exp(-alpha * (v - lam)) for v in pos_kept)) / alpha +
                  np.log1p(sum(np.exp(beta * (v - lam)) for v in neg_kept)) / beta)
  got = losses_lib.multi_similarity_loss(jnp.asarray(x), jnp.asarray(labels))
  np.testing.assert_allclose(float(got), np.mean(losses), rtol=1e-4)


def test_pk_batches_draw_p_writers_with_k_fragments_each():
  writer_ids = np.array([0] * 5 + [1] * 3 + [2] * 1 + [3] * 4 + [4] * 2)
  sampler = data.PKBatches(writer_ids, writers_per_batch=3, per_writer=4, seed=7)
  for b in range(20):
    batch = sampler[b]
    writers = writer_ids[batch].reshape(3, 4)
    assert (writers == writers[:, :1]).all()  # K fragments of one writer per row
    assert len(set(writers[:, 0])) == 3 and 2 not in writers  # no single-fragment writer
    np.testing.assert_array_equal(batch, data.PKBatches(writer_ids, 3, 4, seed=7)[b])
  with pytest.raises(ValueError, match='need 5 writers with 2\\+ fragments'):
    data.PKBatches(writer_ids, writers_per_batch=5, per_writer=2, seed=0)


def test_netvlad_encoder_embeds_to_unit_vectors():
  from flax import nnx
  from configs import fragments
  config = fragments.get_config('test')
  config.model.pooling = 'netvlad'
  model = model_lib.make_model(config, nnx.Rngs(0))
  images = jnp.asarray(np.random.default_rng(0).integers(0, 255, (3, 64, 64, 1), np.uint8))
  embeddings = model(model_lib.preprocess(images, config), train=False)
  assert embeddings.shape == (3, config.model.embedding_dim)
  np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)


def test_train_evaluate_and_score_exported_distances(fragment_data, fragment_evaluated):
  workdir = fragment_evaluated
  with open(os.path.join(workdir, 'eval', 'metrics.json')) as f:
    scores = json.load(f)
  report = scores['test']
  for method in ('encoder', 'configured', 'srs_lbp', 'tuned'):
    for labeling in ('writer', 'page'):
      for k in ('map', 'top1', 'top1_answerable', 'pr10', 'pr100'):
        assert 0.0 <= report[f'{method}/{labeling}/{k}'] <= 1.0
  # Val chose the post-processing; test applied that choice, and scores it as its headline.
  chosen = {k: v for k, v in scores['val'].items() if k.startswith('tuned_settings/')}
  assert chosen['tuned_settings/chosen_on'] == 'val'
  assert chosen == {k: v for k, v in report.items() if k.startswith('tuned_settings/')}
  assert report['score'] == report['tuned/writer/map']
  assert not any(k.startswith('tuning/') for k in report)
  names = sorted(os.listdir(os.path.join(fragment_data, 'test')))
  distances = np.load(os.path.join(workdir, 'eval', 'distances_test.npy'))
  assert distances.shape == (len(names), len(names))
  # Scoring the exported CSV (eval.export_method: tuned) from outside gives the evaluator's
  # own figures.
  result = run_module('launch.score_distances', '--distances',
                      os.path.join(workdir, 'eval', 'distances_test.csv'), '--data',
                      os.path.join(fragment_data, 'test'))
  scored = json.loads(result.stdout)
  for labeling in ('writer', 'page'):
    for k in ('map', 'top1', 'pr10', 'pr100'):
      assert scored[labeling][k] == pytest.approx(report[f'tuned/{labeling}/{k}'], abs=1e-6)


def test_val_writers_are_held_out_of_training(fragment_data):
  from configs import fragments
  config = fragments.get_config('test')
  config.data.dir = fragment_data
  train, val = data.listing(config, 'train'), data.listing(config, 'val')
  train_writers = {f.writer for f in train.fragments}
  val_writers = {f.writer for f in val.fragments}
  assert len(val_writers) == 2 and len(train_writers) == 4 and not train_writers & val_writers
  everything = sorted(os.listdir(os.path.join(fragment_data, 'train')))
  assert sorted(os.path.basename(f.path) for f in [*train.fragments, *val.fragments]) == \
      everything
  # Read through the whole train folder's listing: fragment i of val is val's file i.
  assert np.array_equal(val.read_rgb(0), reader.decode(val.fragments[0].path))
  # Drawn by data.val_seed alone: the training seed does not move them.
  config.seed = 5
  assert {f.writer for f in data.listing(config, 'val').fragments} == val_writers
  config.data.val_seed = 1
  assert {f.writer for f in data.listing(config, 'val').fragments} != val_writers
  config.data.val_writers = 0.0
  assert len(data.listing(config, 'train').fragments) == len(everything)
  with pytest.raises(ValueError, match="split 'val' is empty: config.data.val_writers is 0"):
    data.listing(config, 'val')


@pytest.mark.slow
def test_predict_says_in_one_line_that_fragments_have_no_predictor(fragment_data,
                                                                   fragment_evaluated):
  result = run_module('launch.predict', '--config=configs/fragments.py:test', '--data',
                      fragment_data, '--workdir', fragment_evaluated, check=False)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines() == [
      'Error: retrieval.fragments.task has no predictor (it has no submission format); python -m '
      'launch.evaluate writes its scores and exports']
  # What it says: the same command with launch.evaluate (fragment_evaluated ran it) wrote them.
  assert {'metrics.json', 'distances_test.npy', 'distances_test.csv'} <= set(
      os.listdir(os.path.join(fragment_evaluated, 'eval')))


def _pipeline(encoder, lbp_embeddings):
  from configs import fragments
  from retrieval.fragments import evaluate
  config = fragments.get_config('test')
  starts = np.arange(len(encoder) + 1)  # one patch a fragment: its descriptor is itself
  return evaluate.Pipeline(config, encoder, starts, lbp_embeddings, whitening_fit=None)


def test_val_keeps_a_step_off_unless_it_helps():
  from retrieval.fragments import evaluate
  rng = np.random.default_rng(0)
  writers = np.repeat(np.arange(12), 5)
  noisy = rng.normal(size=(60, 16)).astype(np.float32) + 0.8 * rng.normal(size=(12, 16))[writers]
  clean = (rng.normal(size=(12, 16))[writers] + 0.05 * rng.normal(size=(60, 16))).astype(np.float32)
  labels = {'writer': writers, 'page': writers}
  # SRS-LBP that tells the writers apart perfectly: fusion is chosen.
  chosen, tried = evaluate.choose_settings(_pipeline(noisy, clean), labels)
  assert chosen['fusion_weight'] > 0
  assert tried['fusion_weight'][str(chosen['fusion_weight'])] > tried['fusion_weight']['0.0']
  # SRS-LBP that is noise: fusion stays off, and so does every step that does not help.
  chosen, tried = evaluate.choose_settings(_pipeline(clean, rng.normal(size=(60, 16)).astype(np.float32)),
                                labels)
  assert chosen['fusion_weight'] == 0.0
  for name, grid in evaluate.GRIDS:
    off = tried[name][str(grid[0])]
    assert chosen[name] == grid[0] or tried[name][str(chosen[name])] > off
  # Whitening is tried only up to what 60 descriptors of 16 dims allow.
  assert set(tried['whitening_dims']) == {'0', '16'}


def test_whitening_beyond_the_descriptor_is_an_error_not_a_silent_cut():
  rng = np.random.default_rng(0)
  pipeline = _pipeline(rng.normal(size=(60, 16)).astype(np.float32), None)
  assert pipeline.descriptors(1.0, 16).shape == (60, 16)
  with pytest.raises(ValueError, match='whitening to 512 dims: at most 16 here '
                                       r'\(descriptors of 16 dims, fitted on 60 fragments\)'):
    pipeline.descriptors(1.0, 512)
