"""Metric-learning losses over a P x K batch of fragment embeddings (writer = class)."""
import inspect

import jax
import jax.numpy as jnp

from bengrapheme import augment, errors
from retrieval.fragments.model import preprocess


def pairwise_distances(embeddings):
  """Euclidean distances [B, B] of L2-normalised embeddings, with a stable zero diagonal."""
  sq = jnp.maximum(2.0 - 2.0 * embeddings @ embeddings.T, 0.0)
  return jnp.sqrt(sq + 1e-12) * (1.0 - jnp.eye(embeddings.shape[0]))


def batch_hard_triplet_loss(embeddings, labels, margin):
  """Hermans et al. 2017: per anchor, its hardest positive against its hardest negative.

  `margin` None -> the soft margin log(1 + exp(d_ap - d_an)). Anchors without a positive or
  a negative in the batch are left out.
  """
  d = pairwise_distances(embeddings)
  same = labels[:, None] == labels[None, :]
  positive = same & ~jnp.eye(len(labels), dtype=bool)
  hardest_pos = jnp.max(jnp.where(positive, d, -jnp.inf), axis=1)
  hardest_neg = jnp.min(jnp.where(same, jnp.inf, d), axis=1)
  valid = positive.any(1) & (~same).any(1)
  gap = jnp.where(valid, hardest_pos - hardest_neg, 0.0)
  per_anchor = jax.nn.softplus(gap) if margin is None else jax.nn.relu(gap + margin)
  return jnp.sum(jnp.where(valid, per_anchor, 0.0)) / jnp.maximum(valid.sum(), 1)


def multi_similarity_loss(embeddings, labels, alpha=2.0, beta=50.0, lam=0.5, epsilon=0.1):
  """Wang et al. 2019 with its pair mining, on cosine similarities."""
  s = embeddings @ embeddings.T
  same = labels[:, None] == labels[None, :]
  positive = same & ~jnp.eye(len(labels), dtype=bool)
  negative = ~same
  # Mining: keep negatives harder than the easiest positive (+eps), positives harder than
  # the hardest negative (-eps).
  min_pos = jnp.min(jnp.where(positive, s, jnp.inf), 1, keepdims=True)
  max_neg = jnp.max(jnp.where(negative, s, -jnp.inf), 1, keepdims=True)
  neg_kept = negative & (s + epsilon > min_pos)
  pos_kept = positive & (s - epsilon < max_neg)
  pos_term = jnp.log1p(jnp.sum(jnp.where(pos_kept, jnp.exp(-alpha * (s - lam)), 0.0), 1)) / alpha
  neg_term = jnp.log1p(jnp.sum(jnp.where(neg_kept, jnp.exp(beta * (s - lam)), 0.0), 1)) / beta
  valid = positive.any(1) & negative.any(1)
  return jnp.sum(jnp.where(valid, pos_term + neg_term, 0.0)) / jnp.maximum(valid.sum(), 1)


# The losses config.loss.name chooses from; each takes its constants from config.loss.NAME.
LOSSES = {'batch_hard': batch_hard_triplet_loss, 'multi_similarity': multi_similarity_loss}


def check_loss(config):
  """UserError unless config.loss names a loss of LOSSES and only arguments it takes."""
  name = config.loss.name
  if name not in LOSSES:
    raise errors.ConfigError(f'loss.name={name!r}: expected one of {", ".join(LOSSES)}')
  taken = list(inspect.signature(LOSSES[name]).parameters)[2:]  # after embeddings, labels
  unknown = sorted(set(config.loss.get(name, {})) - set(taken))
  if unknown:
    raise errors.ConfigError(f'loss.{name}.{unknown[0]}: {name} takes {", ".join(taken)}')


def embed(model, batch, key, config):
  """The embeddings [B, D] of the augmented batch; rows are independent (train.py may compute
  them in chunks, as gradient accumulation does)."""
  images, _ = augment.apply(key, preprocess(batch['image'], config), (), config.aug)
  return model(images, train=True)


def batch_loss(embeddings, batch, config):
  """The chosen metric-learning loss over the whole global batch (jit sees it across all
  devices): it couples every row with every other one; the classes are writers or surrogate
  classes (retrieval/fragments/data.py)."""
  labels = batch['label']
  name = config.loss.name
  value = LOSSES[name](embeddings, labels, **config.loss.get(name, {}))
  # The mean similarity of positive pairs minus that of negative pairs: a signal that keeps
  # moving while the loss flattens (a share of violated triplets sits at 1.0 from scratch).
  s = embeddings @ embeddings.T
  same = labels[:, None] == labels[None, :]
  positive = same & ~jnp.eye(len(labels), dtype=bool)
  gap = (jnp.sum(jnp.where(positive, s, 0)) / jnp.maximum(positive.sum(), 1) -
         jnp.sum(jnp.where(same, 0, s)) / jnp.maximum((~same).sum(), 1))
  return value, {'similarity_gap': gap}


def loss(model, batch, key, config):
  return batch_loss(embed(model, batch, key, config), batch, config)
