"""The grapheme classifier: a backbone with one head per component (and the whole-grapheme
head), and the on-device preprocessing of its uint8 input.

Model input: the 137x236 uint8 image, inverted so ink is high and paper is 0 (zero padding in
augmentation then means blank paper), resized on device to `config.input.size`.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from bengrapheme import models
from bengrapheme.grapheme import classes, kaggle


class GraphemeModel(nnx.Module):
  """Backbone + one linear head per component (+ the optional 1,295-way grapheme head)."""

  def __init__(self, config, rngs):
    self.backbone = models.backbone(config.model.name, in_channels=1, rngs=rngs,
                                    **config.model.args)
    features = self.backbone.features
    self.consonant_parts = config.model.consonant_parts
    self.corrected_labels = config.data.corrected_labels
    # With consonant_parts the consonant diacritic is read off 4 part logits, not a 7-way
    # (8-way with the corrected labels) head.
    sizes = classes.num_classes(self.corrected_labels)
    if self.consonant_parts:
      sizes = sizes[:2] + (len(classes.CONSONANT_PART_NAMES),)
    self.heads = nnx.List([nnx.Linear(features, n, rngs=rngs) for n in sizes])
    self.root_letters = None
    if config.model.root_letters:
      self.root_letters = nnx.data(
          nnx.Linear(features, len(classes.ROOT_LETTER_SLOTS), rngs=rngs))
    self.grapheme_head = None
    if config.model.grapheme_head:
      self.grapheme_head = nnx.data(nnx.Linear(features, classes.NUM_GRAPHEMES, rngs=rngs))

  def __call__(self, x, train=False):
    features = self.backbone(x, train=train).astype(jnp.float32)
    logits = {name: head(features) for name, head in zip(kaggle.COMPONENTS, self.heads)}
    if self.consonant_parts:
      logits['consonant_parts'] = logits['consonant_diacritic']
      logits['consonant_diacritic'] = log_probs_from_parts(
          logits['consonant_parts'], classes.consonant_parts(self.corrected_labels))
    if self.root_letters is not None:
      # A product of experts: the root head's scores plus the log-likelihood of each root's
      # letter pattern, so a root the head has seen little of scores high when its letters do.
      logits['root_letters'] = self.root_letters(features)
      logits['grapheme_root'] = jax.nn.log_softmax(
          logits['grapheme_root'] + log_probs_from_parts(logits['root_letters'],
                                                         classes.ROOT_LETTERS), -1)
    if self.grapheme_head is not None:
      logits['grapheme'] = self.grapheme_head(features)
    return logits


def log_probs_from_parts(part_logits, patterns):
  """[B, P] independent part logits -> [B, C] log-probabilities of the classes whose part
  `patterns` [C, P] are given (classes.consonant_parts: the 7 Kaggle consonant classes, or 8,
  from 4 parts; classes.ROOT_LETTERS: the 168 roots from their letters).

  Each class's score is the log-likelihood of its part pattern, renormalised over the
  patterns that exist: a class seen in few graphemes (consonant class 3: reph + ya-phala)
  scores high whenever each of its parts does."""
  parts = jnp.asarray(patterns, jnp.float32)
  on, off = jax.nn.log_sigmoid(part_logits), jax.nn.log_sigmoid(-part_logits)
  return jax.nn.log_softmax(on @ parts.T + off @ (1 - parts).T, -1)


def make_model(config, rngs):
  return GraphemeModel(config, rngs)


# Pixels of paper (in the 137x236 source frame) that crop_to_ink keeps around the ink box
# in training; test-time views (config.predict.tta_margins) vary it.
CROP_MARGIN = 4


def preprocess(images, config, margin=CROP_MARGIN):
  """uint8 [B, 137, 236] -> float32 [B, H, W, 1], ink high, at config.input.size; with
  crop_to_ink, `margin` pixels of paper around the ink box."""
  x = (255.0 - images.astype(jnp.float32)) / 255.0
  if config.input.stretch_contrast:
    x = stretch_contrast(x)
  if config.input.crop_to_ink:
    x = crop_to_ink(x, tuple(config.input.size), config.input.ink_threshold, margin)
  else:
    x = jax.image.resize(x, (x.shape[0], *config.input.size), method='linear', antialias=True)
  return x[..., None]


def stretch_contrast(x):
  """Maps each image's paper to 0 and its darkest ink to 1.

  Scans differ in paper tint and pen darkness; without this a grey paper can pass the ink
  threshold (the crop then keeps the whole frame) and a light pen look faint. Paper is
  estimated by the image's mean (paper covers most of the frame), ink by the largest value
  of a 3x3 box blur (a single noisy pixel does not set it).
  """
  paper = x.mean((1, 2), keepdims=True)
  blurred = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3, 3), (1, 1, 1), 'SAME') / 9
  ink = blurred.max((1, 2), keepdims=True)
  return jnp.clip((x - paper) / jnp.maximum(ink - paper, 0.1), 0.0, 1.0)


def crop_to_ink(x, size, threshold, margin=CROP_MARGIN):
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
