"""The grapheme task as the trainer sees it: sources, model, loss, evaluator, predictions.

Model input: the 137x236 uint8 image, inverted so ink is high and paper is 0 (zero padding in
augmentation then means blank paper), resized on device to `config.input.size`.
"""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils

from bengrapheme import augment, files, input as input_lib, metrics, models, parallel
from bengrapheme.grapheme import classes, kaggle, prepare

# Triple of each whole-grapheme class, to turn a whole-grapheme prediction into components.
GRAPHEME_TRIPLES = np.array([g[:3] for g in classes.GRAPHEMES], np.int32)


# ---------------------------------------------------------------- data


def cache_dir(config, workdir):
  return files.prepared_dir(config, workdir)


def _source(config, workdir, split):
  """Prepares (once, cached) and opens `split` ('train' or 'test') of config.data.dir, or
  opens it in the TFDS build in config.data.tfds_dir (format 'tfds'): the same records."""
  if config.data.format == 'tfds':
    if not config.data.tfds_dir:
      raise ValueError("config.data.format='tfds' needs config.data.tfds_dir, a TFDS data "
                       'dir holding a bengaliai build')
    # Imported only here: tensorflow_datasets takes ~0.5 s to import.
    from bengrapheme.grapheme import tfds_bengaliai
    return tfds_bengaliai.TfdsGraphemeSource(config.data.tfds_dir, split)
  if config.data.format != 'kaggle':
    raise ValueError(f"config.data.format={config.data.format!r}: expected 'kaggle' or 'tfds'")
  if not config.data.dir:
    raise ValueError('no data: pass --data DIR (a Kaggle bengaliai-cv19 folder) or set '
                     'config.data.dir')
  # Process 0 converts first; the others then find the cache (or build their own when the
  # cache dir is not shared between hosts).
  if jax.process_index() == 0:
    path = prepare.prepare(config.data.dir, split, cache_dir(config, workdir))
  multihost_utils.sync_global_devices(f'prepare {split}')
  if jax.process_index() != 0:
    path = prepare.prepare(config.data.dir, split, cache_dir(config, workdir))
  return prepare.GraphemeSource(path)


def source(config, workdir, split):
  """'train' (minus the hold-out), 'val' (hold-out of train.csv) or 'test'."""
  if split == 'test':
    return _source(config, workdir, 'test')
  if split not in ('train', 'val'):
    raise ValueError(f"split {split!r}: expected 'train', 'val' or 'test'")
  train, val = input_lib.holdout_split(_source(config, workdir, 'train'),
                                       config.data.val_fraction, config.seed)
  if split == 'val' and len(val) == 0:
    raise ValueError("split 'val' is empty: set config.data.val_fraction > 0")
  return train if split == 'train' else val


def train_data(config, workdir, local_batch):
  """Shuffled, endless batches of this process's share of the training images."""
  return input_lib.train_dataset(
      source(config, workdir, 'train'), batch_size=local_batch, seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count(),
      num_threads=config.input.num_threads)


# ---------------------------------------------------------------- model


class GraphemeModel(nnx.Module):
  """Backbone + one linear head per component (+ the optional 1,295-way grapheme head)."""

  def __init__(self, config, rngs):
    self.backbone = models.backbone(config.model.name, in_channels=1, rngs=rngs,
                                    **config.model.args)
    features = self.backbone.features
    self.heads = nnx.List([nnx.Linear(features, n, rngs=rngs) for n in kaggle.NUM_CLASSES])
    self.grapheme_head = None
    if config.model.grapheme_head:
      self.grapheme_head = nnx.data(nnx.Linear(features, classes.NUM_GRAPHEMES, rngs=rngs))

  def __call__(self, x, train=False):
    features = self.backbone(x, train=train).astype(jnp.float32)
    logits = {name: head(features) for name, head in zip(kaggle.COMPONENTS, self.heads)}
    if self.grapheme_head is not None:
      logits['grapheme'] = self.grapheme_head(features)
    return logits


def make_model(config, rngs):
  return GraphemeModel(config, rngs)


def preprocess(images, config):
  """uint8 [B, 137, 236] -> float32 [B, H, W, 1], ink high, at config.input.size."""
  x = (255.0 - images.astype(jnp.float32)) / 255.0
  if config.input.crop_to_ink:
    x = crop_to_ink(x, tuple(config.input.size), config.input.ink_threshold)
  else:
    x = jax.image.resize(x, (x.shape[0], *config.input.size), method='linear', antialias=True)
  return x[..., None]


def crop_to_ink(x, size, threshold, margin=4):
  """Scales each image so the bounding box of its ink fills `size`, keeping the aspect ratio.

  Graphemes vary widely in size and position within the 137x236 frame; normalising that
  away lets a low-resolution model spend its pixels on strokes (most strong public Bengali.AI
  pipelines crop this way). The box is found on a 5x5 box-blurred copy, so specks of paper
  noise do not stretch it.
  """
  batch, height, width = x.shape
  blurred = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 5, 5), (1, 1, 1), 'SAME') / 25
  ink = blurred > threshold
  rows, cols = ink.any(2), ink.any(1)

  def extent(mask, n):  # first and last index holding ink; the whole axis when there is none
    first = jnp.argmax(mask, 1)
    last = n - 1 - jnp.argmax(mask[:, ::-1], 1)
    found = mask.any(1)
    return jnp.where(found, first, 0), jnp.where(found, last, n - 1)

  top, bottom = extent(rows, height)
  left, right = extent(cols, width)
  box_h = (bottom - top + 1 + 2 * margin).astype(jnp.float32)
  box_w = (right - left + 1 + 2 * margin).astype(jnp.float32)
  out_h, out_w = size
  scale = jnp.minimum(out_h / box_h, out_w / box_w)
  # scale_and_translate maps input coordinate u (pixel centres at i + 0.5) to u * s + t.
  centre_y = (top + bottom + 1) / 2
  centre_x = (left + right + 1) / 2
  translation = jnp.stack([out_h / 2 - scale * centre_y, out_w / 2 - scale * centre_x], -1)

  def one(image, s, t):
    return jax.image.scale_and_translate(image, size, (0, 1), jnp.stack([s, s]), t,
                                         method='linear', antialias=True)

  return jax.vmap(one)(x, scale, translation)


# ---------------------------------------------------------------- loss


def _targets(batch, whole_grapheme):
  targets = [jax.nn.one_hot(batch['labels'][:, i], n) for i, n in enumerate(kaggle.NUM_CLASSES)]
  if whole_grapheme:  # unseen or unknown graphemes (id -1) get an all-zero target row
    targets.append(jax.nn.one_hot(batch['grapheme'], classes.NUM_GRAPHEMES))
  return tuple(targets)


def loss(model, batch, key, config):
  """Weighted soft-target cross-entropy of the mixed/augmented batch; returns (loss, aux)."""
  images = preprocess(batch['image'], config)
  whole = config.model.grapheme_head
  images, targets = augment.apply(key, images, _targets(batch, whole), config.aug)
  logits = model(images, train=True)
  ce = [optax.softmax_cross_entropy(logits[name], t).mean()
        for name, t in zip(kaggle.COMPONENTS, targets)]
  # The loss weights the components as the competition score does (root 2 : 1 : 1).
  weights = metrics.COMPONENT_WEIGHTS
  total = sum(w * c for w, c in zip(weights, ce)) / sum(weights)
  aux = {f'ce_{name}': c for name, c in zip(kaggle.COMPONENTS, ce)}
  if whole:
    aux['ce_grapheme'] = optax.softmax_cross_entropy(logits['grapheme'], targets[3]).mean()
    total = total + config.model.grapheme_loss_weight * aux['ce_grapheme']
  return total, aux


# ---------------------------------------------------------------- predictions


def predict_components(logits, seen_threshold):
  """Component labels [B, 3] from the heads.

  With a whole-grapheme head (the winning Bengali.AI recipe): where it is confident that the
  image is one of the 1,295 known graphemes, that grapheme's components are used; otherwise
  (an unseen grapheme, most likely) the component heads decide.
  """
  components = jnp.stack([jnp.argmax(logits[n], -1) for n in kaggle.COMPONENTS], -1)
  if 'grapheme' not in logits:
    return components
  probs = jax.nn.softmax(logits['grapheme'], -1)
  seen = jnp.max(probs, -1) >= seen_threshold
  from_grapheme = jnp.asarray(GRAPHEME_TRIPLES)[jnp.argmax(probs, -1)]
  return jnp.where(seen[:, None], from_grapheme, components)


def _predict_fn(graphdef, config, mesh):
  """Jitted batch -> components, index and mask, replicated so any process can read them."""

  def forward(variables, batch):
    model = nnx.merge(graphdef, *variables)
    logits = model(preprocess(batch['image'], config), train=False)
    components = predict_components(logits, config.predict.seen_threshold)
    return components, batch['index'], batch['mask']

  return jax.jit(forward, out_shardings=parallel.replicated(mesh))


# ---------------------------------------------------------------- evaluator

# Subsets scored separately; a subset with no example in a split is left out of the report.
SUBSETS = ('all', 'seen', 'unseen')


def evaluate(config, split, graphdef, variables, mesh, workdir, details=None):
  """Hierarchical macro recall on `split`; confusion matrices accumulate on device.

  Reports the component heads ('heads') and, with a whole-grapheme head, the combined rule
  used for predictions, each over all images and over seen / unseen graphemes. A `details`
  dict, when given, receives what bengrapheme/grapheme/report.py shows: per image, arrays of
  N rows sorted by `index` (the image's row in `source`): `labels`, `predictions` of the
  reported `rule`, and `seen` (its grapheme is one of the 1,295).
  """
  src = source(config, workdir, split)
  if not _has_labels(src):
    raise ValueError(f"split {split!r} has no labels to score (Kaggle's test.csv has none; "
                     'evaluate on val, or on synthetic data with test_labels.csv)')
  whole = config.model.grapheme_head
  rules = ('heads', 'combined') if whole else ('heads',)

  # Replicated outputs: every process can read the totals, even on a multi-host mesh.
  @functools.partial(jax.jit, donate_argnums=0, out_shardings=parallel.replicated(mesh))
  def step(confusions, batch):
    model = nnx.merge(graphdef, *variables)
    logits = model(preprocess(batch['image'], config), train=False)
    preds = {'heads': predict_components({n: logits[n] for n in kaggle.COMPONENTS}, 1.0)}
    if whole:
      preds['combined'] = predict_components(logits, config.predict.seen_threshold)
    seen = batch['grapheme'] >= 0
    weights = {'all': batch['mask'], 'seen': batch['mask'] & seen,
               'unseen': batch['mask'] & ~seen}
    confusions = {(rule, subset): metrics.update_confusion(confusions[(rule, subset)],
                                                           batch['labels'], preds[rule],
                                                           weights[subset])
                  for rule in rules for subset in SUBSETS}
    per_image = dict(index=batch['index'], mask=batch['mask'], labels=batch['labels'],
                     predictions=preds[rules[-1]], seen=seen)
    return confusions, {s: w.sum() for s, w in weights.items()}, per_image

  confusions = {(rule, subset): metrics.init_confusion() for rule in rules for subset in SUBSETS}
  counts = dict.fromkeys(SUBSETS, 0)
  per_image = []
  local_batch = parallel.per_process_batch(config.eval.batch_size, mesh)
  for batch in input_lib.eval_batches(src, batch_size=local_batch,
                                      process_index=jax.process_index(),
                                      process_count=jax.process_count()):
    batch = parallel.global_batch(mesh, {k: batch[k] for k in
                                         ('image', 'labels', 'grapheme', 'index', 'mask')})
    confusions, batch_counts, batch_per_image = step(confusions, batch)
    counts = {s: counts[s] + batch_counts[s] for s in SUBSETS}  # stays on device
    if details is not None:  # only then do per-image results travel to the host
      per_image.append(batch_per_image)
  counts = jax.device_get(counts)
  report = {'num_images': int(counts['all'])}
  for (rule, subset), confusion in confusions.items():
    if counts[subset]:
      scores = metrics.scores_from_confusion(jax.device_get(confusion))
      report.update({f'{rule}/{subset}/{k}': v for k, v in scores.items()})
  report['score'] = report[f'{rules[-1]}/all/score']
  report['num_seen'], report['num_unseen'] = int(counts['seen']), int(counts['unseen'])
  if details is not None:
    batches = jax.device_get(per_image)
    rows = {k: np.concatenate([b[k][b['mask']] for b in batches])
            for k in ('index', 'labels', 'predictions', 'seen')}
    order = np.argsort(rows['index'])
    details.update({k: v[order] for k, v in rows.items()}, rule=rules[-1],
                   # `index` names rows of the prepared split (a val hold-out is a Subset).
                   source=getattr(src, 'source', src))
  return report


def _has_labels(src):
  """Kaggle's test split has no labels (-1 everywhere); checked on the first row."""
  return len(src) > 0 and src[0]['labels'][0] >= 0


# ---------------------------------------------------------------- submission


def predict(config, graphdef, variables, mesh, workdir):
  """Writes workdir/submission.csv: row_id,target in exactly the order of test.csv."""
  src = source(config, workdir, 'test')
  rows = kaggle.test_rows(config.data.dir)
  fn = _predict_fn(graphdef, config, mesh)
  local_batch = parallel.per_process_batch(config.eval.batch_size, mesh)
  predictions = []
  for batch in input_lib.eval_batches(src, batch_size=local_batch,
                                      process_index=jax.process_index(),
                                      process_count=jax.process_count()):
    batch = parallel.global_batch(mesh, {k: batch[k] for k in ('image', 'index', 'mask')})
    predictions.append(fn(variables, batch))
  # One transfer at the end; batches are gathered from every process (replicated output).
  by_index = np.full((len(src), 3), -1, np.int64)
  for components, index, mask in jax.device_get(predictions):
    by_index[index[mask]] = components[mask]
  if (by_index < 0).any():
    raise RuntimeError(f'{(by_index < 0).any(1).sum()} test images got no prediction')
  position = {image_id: i for i, image_id in enumerate(src.image_ids)}
  column = {name: i for i, name in enumerate(kaggle.COMPONENTS)}
  targets = [by_index[position[image_id], column[component]]
             for _, image_id, component in rows]
  path = files.join(workdir, 'submission.csv')
  if jax.process_index() == 0:
    write_submission(path, [r[0] for r in rows], targets)
  return path


def write_submission(path, row_ids, targets):
  """Writes row_id,target atomically: a crash never leaves a partial submission."""
  if len(row_ids) != len(targets):
    raise ValueError(f'{len(row_ids)} row ids but {len(targets)} targets')
  files.write_atomic(path, 'row_id,target\n' + ''.join(
      f'{r},{int(t)}\n' for r, t in zip(row_ids, targets)))
