"""The grapheme training loss: soft-target cross-entropy of the augmented, mixed batch."""
import jax
import jax.numpy as jnp
import optax

from bengrapheme import augment
from bengrapheme.grapheme import classes, kaggle, metrics
from bengrapheme.grapheme.model import preprocess


def _targets(batch, whole_grapheme, num_classes):
  targets = [jax.nn.one_hot(batch['labels'][:, i], n) for i, n in enumerate(num_classes)]
  if whole_grapheme:  # unseen or unknown graphemes (id -1) get an all-zero target row
    targets.append(jax.nn.one_hot(batch['grapheme'], classes.NUM_GRAPHEMES))
  return tuple(targets)


def loss(model, batch, key, config):
  """Weighted soft-target cross-entropy of the mixed/augmented batch; returns (loss, aux)."""
  images = preprocess(batch['image'], config)
  whole = config.model.grapheme_head
  corrected = config.data.corrected_labels
  images, targets = augment.apply(
      key, images, _targets(batch, whole, classes.num_classes(corrected)), config.aug)
  logits = model(images, train=True)
  ce = [optax.softmax_cross_entropy(logits[name], t).mean()
        for name, t in zip(kaggle.COMPONENTS[:2], targets)]
  if config.model.consonant_parts:  # each part a binary target: the (mixed) class target's mass
    part_targets = targets[2] @ jnp.asarray(classes.consonant_parts(corrected), jnp.float32)
    ce.append(optax.sigmoid_binary_cross_entropy(logits['consonant_parts'], part_targets)
              .sum(-1).mean())
  else:
    ce.append(optax.softmax_cross_entropy(logits['consonant_diacritic'], targets[2]).mean())
  # The loss weights the components as the competition score does (root 2 : 1 : 1).
  weights = metrics.COMPONENT_WEIGHTS
  total = sum(w * c for w, c in zip(weights, ce)) / sum(weights)
  aux = {f'ce_{name}': c for name, c in zip(kaggle.COMPONENTS, ce)}
  if config.model.root_letters:  # each letter slot a binary target
    letter_targets = targets[0] @ jnp.asarray(classes.ROOT_LETTERS, jnp.float32)
    aux['ce_root_letters'] = optax.sigmoid_binary_cross_entropy(
        logits['root_letters'], letter_targets).sum(-1).mean()
    total = total + config.model.root_letters_weight * aux['ce_root_letters']
  if whole:
    aux['ce_grapheme'] = optax.softmax_cross_entropy(logits['grapheme'], targets[3]).mean()
    total = total + config.model.grapheme_loss_weight * aux['ce_grapheme']
  return total, aux
