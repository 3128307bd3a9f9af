"""Hierarchical macro recall, the Bengali.AI score, from one confusion matrix per component.

The matrices are counted in one of two places, and `from_confusion` scores either:
- on the devices (`confusion_on_device`), where the evaluator makes its predictions: a
  scatter-add per batch inside the jitted eval step, padding rows masked out, accumulated
  across batches there. On a mesh that spans several processes, jit's reduction over the
  batch axes is the sum across processes, so the score needs no prediction on any host,
  however many rows and hosts there are.
- on the host (`confusion_from_labels`, np.bincount), for labels already there:
  `hierarchical_macro_recall`, and the report, which draws per-class views and misclassified
  images from per-example predictions anyway.
Both count the same matrices; bench/metrics_speed.py times each against sklearn.

Macro recall follows sklearn's `recall_score(average='macro')` with its default labels: the
mean over every class present in y_true or y_pred, where a class seen only in predictions has
recall 0. The score weights the components root 2 : vowel 1 : consonant 1.
"""
import jax.numpy as jnp
import numpy as np

# The Bengali.AI label columns and their class counts; bengrapheme/grapheme/kaggle.py reads
# files with them.
COMPONENTS = ('grapheme_root', 'vowel_diacritic', 'consonant_diacritic')
NUM_CLASSES = (168, 11, 7)
COMPONENT_WEIGHTS = (2.0, 1.0, 1.0)


def _macro_recall(matrix):
  support = matrix.sum(axis=1)
  predicted = matrix.sum(axis=0)
  present = (support > 0) | (predicted > 0)
  # Classes seen only in predictions have zero support: recall 0, as sklearn reports.
  recall = np.diag(matrix) / np.maximum(support, 1)
  return float(recall[present].mean())


def from_confusion(confusion):
  """The score of the three confusion matrices (true x predicted; numpy or jax arrays): a
  dict of per-component macro recall and the 2:1:1 weighted `score`, as Python floats."""
  confusion = [np.asarray(m, np.float64) for m in confusion]
  scores = {name: _macro_recall(m) for name, m in zip(COMPONENTS, confusion)}
  total = sum(w * scores[name] for w, name in zip(COMPONENT_WEIGHTS, COMPONENTS))
  scores['score'] = total / sum(COMPONENT_WEIGHTS)
  return scores


def _check_labels(name, y):
  """Checks labels [N, 3] in full, naming the first bad column (the slow path, for errors)."""
  y = np.asarray(y)
  if y.ndim != 2 or y.shape[1] != len(COMPONENTS) or y.shape[0] == 0:
    raise ValueError(f'{name}: expected a non-empty int array [N, {len(COMPONENTS)}] in column '
                     f'order {COMPONENTS}, got shape {y.shape}')
  if not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f'{name}: expected integer labels, got dtype {y.dtype}')
  for i, (component, c) in enumerate(zip(COMPONENTS, NUM_CLASSES)):
    column = y[:, i]
    if column.min() < 0 or column.max() >= c:
      raise ValueError(f'{name}[:, {i}] ({component}): expected labels in [0, {c}), got '
                       f'values in [{column.min()}, {column.max()}]')
  return y


def hierarchical_macro_recall(y_true, y_pred):
  """The Bengali.AI score for int arrays [N, 3] (grapheme_root, vowel, consonant).

  Returns a dict with `score`, `grapheme_root`, `vowel_diacritic`, `consonant_diacritic`.
  """
  return from_confusion(confusion_from_labels(y_true, y_pred))


def confusion_from_labels(y_true, y_pred):
  """The three confusion matrices (true x predicted) of int label arrays [N, 3].

  For labels on the host, where counting them beats sending them to the device: for 200,840
  rows this took ~1.2-1.9 ms on 2 shared cores (warm or cold caches), confusion_on_device
  with the transfers ~1.5-1.8 ms, sklearn ~90 ms.
  """
  y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
  for name, y in (('y_true', y_true), ('y_pred', y_pred)):
    if y.ndim != 2 or y.shape[1] != len(COMPONENTS) or not np.issubdtype(y.dtype, np.integer):
      _check_labels(name, y)
  if y_true.shape != y_pred.shape:
    raise ValueError(f'y_true and y_pred: expected the same shape, got {y_true.shape} and '
                     f'{y_pred.shape}')
  # One pass each: seen as unsigned, negative labels are huge, so max <= 255 checks both ends.
  unsigned = lambda y: y.view(np.dtype(f'u{y.dtype.itemsize}'))
  if not len(y_true) or max(unsigned(y_true).max(), unsigned(y_pred).max()) > 255:
    _check_labels('y_true', y_true)
    _check_labels('y_pred', y_pred)
  # Cell (t, p) of a component is counted at code t * 256 + p: a label out of range for its
  # component (all are within 0..255 here) lands outside the component's c x c block instead
  # of aliasing into it, so the block's total checks the whole column at once. Memory-bound:
  # uint16 codes, one column per row ([3, N], so each bincount streams contiguous memory),
  # took ~1.3 ms where per-column range checks and int64 codes on [N, 3] took ~2.
  codes = y_true.T.astype(np.uint16)
  codes <<= 8
  codes |= y_pred.T.astype(np.uint16)
  confusion = []
  for column, c in zip(codes, NUM_CLASSES):
    matrix = np.bincount(column, minlength=c * 256)[:c * 256].reshape(c, 256)[:, :c]
    if matrix.sum() != column.size:  # some label of this component is out of range
      _check_labels('y_true', y_true)
      _check_labels('y_pred', y_pred)
    confusion.append(matrix)
  return confusion


def confusion_on_device(y_true, y_pred, mask):
  """The three confusion matrices (true x predicted) of int label arrays [B, 3], counting
  only the rows where `mask` [B] is true: int32 [168, 168], [11, 11], [7, 7]. Jittable.

  Labels are trusted to be in range (the eval step's own predictions and validated labels):
  nothing is checked on the device. A scatter-add of the mask at t * c + p, exact in int32:
  for 200,840 rows already on the device ~0.7 ms on 2 shared CPU cores, where a one-hot
  matmul (one_hot(t).T @ one_hot(p)) took ~420 ms.
  """
  weight = mask.astype(jnp.int32)
  return [jnp.zeros(c * c, jnp.int32).at[y_true[:, i] * c + y_pred[:, i]].add(weight)
          .reshape(c, c) for i, c in enumerate(NUM_CLASSES)]
