import jax
import numpy as np
import pytest
from sklearn.metrics import recall_score

from bengrapheme.grapheme import metrics
from bengrapheme.grapheme.kaggle import COMPONENTS, NUM_CLASSES


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


@pytest.mark.parametrize('seed,n', [(5, 5), (6, 37), (7, 3000)])
def test_device_path_matches_sklearn_with_padding_masked_out(seed, n):
  """The jitted scatter-add counts the real rows alone and scores them as sklearn does, also
  where few rows leave classes that only the truth or only the predictions hold."""
  rng = np.random.default_rng(seed)
  y_true = random_labels(rng, n)
  y_pred = np.where(rng.random((n, 3)) < 0.7, y_true, random_labels(rng, n))
  # Padding rows among the real ones, with labels of their own (an eval batch pads with
  # zeros): counting any of them would change the score.
  pad = random_labels(rng, n // 2 + 3)
  real = rng.permutation(np.arange(n + len(pad))) < n
  all_true, all_pred = np.zeros((len(real), 3), int), np.zeros((len(real), 3), int)
  all_true[real], all_pred[real] = y_true, y_pred
  all_true[~real], all_pred[~real] = pad, pad[::-1]
  confusion = jax.jit(metrics.confusion_on_device)(all_true, all_pred, real)
  assert [m.dtype for m in confusion] == [np.int32] * 3
  for got, want in zip(confusion, metrics.confusion_from_labels(y_true, y_pred)):
    np.testing.assert_array_equal(got, want)
  assert_same(metrics.from_confusion(confusion), sklearn_scores(y_true, y_pred))


def test_device_path_counts_classes_only_predicted():
  rng = np.random.default_rng(8)
  y_true = random_labels(rng, 200, [c // 2 for c in NUM_CLASSES])
  y_pred = random_labels(rng, 200)
  confusion = jax.jit(metrics.confusion_on_device)(y_true, y_pred, np.ones(200, bool))
  assert_same(metrics.from_confusion(confusion), sklearn_scores(y_true, y_pred))


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
