"""The grapheme training loss: soft-target cross-entropy of the augmented, mixed batch, as
named terms with the weights of config.loss."""
import jax
import jax.numpy as jnp
import optax

from bengrapheme import augment, errors
from bengrapheme.grapheme import classes, kaggle
from bengrapheme.grapheme.model import preprocess


def _targets(batch, whole_grapheme, num_classes):
  targets = [jax.nn.one_hot(batch['labels'][:, i], n) for i, n in enumerate(num_classes)]
  if whole_grapheme:  # unseen or unknown graphemes (id -1) get an all-zero target row
    targets.append(jax.nn.one_hot(batch['grapheme'], classes.NUM_GRAPHEMES))
  return tuple(targets)


# The terms config.loss.terms may weight, each counted when the model has its head.
TERMS = {'root_letters': 'model.root_letters', 'grapheme': 'model.grapheme_head'}


def loss(model, batch, key, config):
  """The named terms of config.loss on the mixed/augmented batch; returns (loss, aux).

  loss.components weights the three components' cross-entropies into their weighted mean;
  each of loss.terms (TERMS) adds its cross-entropy times its weight when its head is on."""
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
  weights = [config.loss.components[name] for name in kaggle.COMPONENTS]
  total = sum(w * c for w, c in zip(weights, ce)) / sum(weights)
  aux = {f'ce_{name}': c for name, c in zip(kaggle.COMPONENTS, ce)}
  terms = config.loss.terms
  if config.model.root_letters and 'root_letters' in terms:  # each letter slot a binary target
    letter_targets = targets[0] @ jnp.asarray(classes.ROOT_LETTERS, jnp.float32)
    aux['ce_root_letters'] = optax.sigmoid_binary_cross_entropy(
        logits['root_letters'], letter_targets).sum(-1).mean()
    total = total + terms.root_letters * aux['ce_root_letters']
  if whole and 'grapheme' in terms:
    aux['ce_grapheme'] = optax.softmax_cross_entropy(logits['grapheme'], targets[3]).mean()
    total = total + terms.grapheme * aux['ce_grapheme']
  return total, aux


def check_loss(config):
  """errors.ConfigError at the first name or weight of config.loss the loss cannot use."""
  components = config.loss.components
  missing = [name for name in kaggle.COMPONENTS if name not in components]
  if missing:
    raise errors.ConfigError(f'loss.components: no weight for {", ".join(missing)}; expected '
                             f'one for each of {", ".join(kaggle.COMPONENTS)}')
  for path, named, known in (('loss.components', components, kaggle.COMPONENTS),
                             ('loss.terms', config.loss.terms, tuple(TERMS))):
    for name, weight in named.items():
      if name not in known:
        raise errors.ConfigError(f'{path}.{name}: expected one of {", ".join(known)}')
      if not isinstance(weight, (int, float)) or weight < 0:
        raise errors.ConfigError(f'{path}.{name}={weight!r}: expected a weight >= 0')
  if not sum(components.values()) > 0:
    raise errors.ConfigError('loss.components: expected a weight > 0 for at least one '
                             'component')
  for name, head in TERMS.items():
    if errors.field(config, head) and name not in config.loss.terms:
      raise errors.ConfigError(f'{head}=True: loss.terms has no {name!r} weight, so its head '
                               f'would never learn; add loss.terms.{name}, or set {head}=False')
