import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from sklearn.metrics import recall_score

from bengrapheme import metrics
from bengrapheme.grapheme.kaggle import COMPONENTS, NUM_CLASSES

from conftest import ROOT


def sklearn_scores(y_true, y_pred):
  scores = {name: recall_score(y_true[:, i], y_pred[:, i], average='macro', zero_division=0)
            for i, name in enumerate(COMPONENTS)}
  scores['score'] = np.average([scores[name] for name in COMPONENTS], weights=[2, 1, 1])
  return scores


def random_labels(rng, n, num_classes=NUM_CLASSES):
  return np.stack([rng.integers(0, c, n) for c in num_classes], axis=1)


def assert_same(got, want):
  assert set(got) == {'score', *COMPONENTS}
  for key in want:
    assert isinstance(got[key], float)
    assert got[key] == pytest.approx(want[key], abs=1e-12), key


@pytest.mark.parametrize('seed,n', [(0, 5), (1, 37), (2, 500), (3, 3000)])
def test_matches_sklearn_random(seed, n):
  rng = np.random.default_rng(seed)
  y_true = random_labels(rng, n)
  # Mostly right predictions, so recall is far from chance; with small n many classes appear
  # only in the truth or only in the predictions.
  y_pred = np.where(rng.random((n, 3)) < 0.7, y_true, random_labels(rng, n))
  assert_same(metrics.hierarchical_macro_recall(y_true, y_pred), sklearn_scores(y_true, y_pred))


def test_classes_only_in_predictions_count_as_zero():
  rng = np.random.default_rng(4)
  # Truth uses the low half of each label range, predictions the high half too.
  y_true = random_labels(rng, 200, [c // 2 for c in NUM_CLASSES])
  y_pred = random_labels(rng, 200)
  got = metrics.hierarchical_macro_recall(y_true, y_pred)
  assert_same(got, sklearn_scores(y_true, y_pred))
  only_true = metrics.hierarchical_macro_recall(y_true, y_true)
  assert only_true['score'] == 1.0


def test_perfect_and_handmade():
  y_true = np.array([[0, 0, 0], [0, 1, 0], [1, 1, 0], [2, 1, 0]])
  y_pred = np.array([[0, 0, 0], [1, 1, 0], [1, 1, 0], [3, 1, 1]])
  got = metrics.hierarchical_macro_recall(y_true, y_pred)
  # Root: classes {0,1,2,3}: recalls 1/2, 1, 0, 0 (3 only predicted) -> 0.375.
  # Vowel: {0,1}: 1, 1 -> 1. Consonant: {0,1}: 3/4, 0 -> 0.375.
  assert got['grapheme_root'] == pytest.approx(0.375)
  assert got['vowel_diacritic'] == pytest.approx(1.0)
  assert got['consonant_diacritic'] == pytest.approx(0.375)
  assert got['score'] == pytest.approx((2 * 0.375 + 1.0 + 0.375) / 4)


def test_masked_rows_are_ignored():
  rng = np.random.default_rng(5)
  y_true, y_pred = random_labels(rng, 300), random_labels(rng, 300)
  weight = rng.random(300) < 0.6
  # Garbage labels in padding rows must not count either, even out of range.
  y_true[~weight] = -1
  y_pred[~weight, 0] = 999
  confusion = metrics.update_confusion(metrics.init_confusion(), y_true, y_pred,
                                       weight.astype(np.float32))
  assert int(confusion[0].sum()) == weight.sum()
  assert_same(metrics.scores_from_confusion(confusion),
              sklearn_scores(y_true[weight], y_pred[weight]))


def test_accumulation_equals_one_shot():
  rng = np.random.default_rng(6)
  y_true, y_pred = random_labels(rng, 1000), random_labels(rng, 1000)
  update = jax.jit(metrics.update_confusion)
  confusion = metrics.init_confusion()
  for start in range(0, 1000, 250):
    stop = start + 250
    confusion = update(confusion, y_true[start:stop], y_pred[start:stop], np.ones(250))
  one_shot = metrics.update_confusion(metrics.init_confusion(), y_true, y_pred)
  for a, b in zip(confusion, one_shot):
    assert a.dtype == np.int32
    np.testing.assert_array_equal(a, b)
  assert metrics.scores_from_confusion(confusion) == \
      metrics.hierarchical_macro_recall(y_true, y_pred)


def test_init_confusion_shapes():
  confusion = metrics.init_confusion()
  assert [m.shape for m in confusion] == [(c, c) for c in NUM_CLASSES]
  assert all(m.dtype == np.int32 and int(m.sum()) == 0 for m in confusion)


@pytest.mark.parametrize('y_true,y_pred,match', [
    (np.zeros((4, 2), int), np.zeros((4, 2), int), r'\[N, 3\]'),
    (np.zeros((0, 3), int), np.zeros((0, 3), int), 'non-empty'),
    (np.zeros((4, 3)), np.zeros((4, 3)), 'integer'),
    (np.full((4, 3), 7), np.zeros((4, 3), int), r'consonant_diacritic.*\[0, 7\)'),
    (np.zeros((4, 3), int), np.full((4, 3), -1), r'y_pred.*grapheme_root'),
    (np.zeros((4, 3), int), np.zeros((5, 3), int), 'same shape'),
])
def test_validation(y_true, y_pred, match):
  with pytest.raises(ValueError, match=match):
    metrics.hierarchical_macro_recall(y_true, y_pred)


def test_empty_confusion_raises():
  with pytest.raises(ValueError, match='empty'):
    metrics.scores_from_confusion(metrics.init_confusion())


# Runs in a fresh interpreter because the simulated device count must be set before jax is
# imported, and another test module may already have imported it in this process.
SHARDED_SCRIPT = textwrap.dedent("""
  import jax, numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from bengrapheme import metrics
  assert jax.device_count() == 8, jax.devices()
  mesh = Mesh(np.array(jax.devices()), ('data',))
  batch, replicated = NamedSharding(mesh, P('data')), NamedSharding(mesh, P())
  rng = np.random.default_rng(7)
  n = 8 * 96
  y_true = np.stack([rng.integers(0, c, n) for c in (168, 11, 7)], 1).astype(np.int32)
  y_pred = np.stack([rng.integers(0, c, n) for c in (168, 11, 7)], 1).astype(np.int32)
  weight = (np.arange(n) < n - 50).astype(np.float32)
  update = jax.jit(metrics.update_confusion, out_shardings=replicated, donate_argnums=0)
  confusion = jax.device_put(metrics.init_confusion(), replicated)
  for _ in range(2):
    args = [jax.device_put(x, batch) for x in (y_true, y_pred, weight)]
    confusion = update(confusion, *args)
  want = metrics.update_confusion(metrics.init_confusion(), y_true[:-50], y_pred[:-50])
  for a, b in zip(confusion, want):
    np.testing.assert_array_equal(np.asarray(a), 2 * np.asarray(b))
  got = metrics.scores_from_confusion(confusion)
  assert got == metrics.hierarchical_macro_recall(y_true[:-50], y_pred[:-50]), got
  print('ok')
""")


def test_sharded_jit_on_8_devices():
  flags = os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=flags,
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
  result = subprocess.run([sys.executable, '-c', SHARDED_SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('ok')
