"""MaskFeat's loss: the mean squared error of the HOG predictions on the masked tokens."""
import jax
import jax.numpy as jnp

from bengrapheme import augment
from retrieval.maskfeat import hog
from retrieval.fragments.model import preprocess


def random_mask(key, batch, tokens, ratio):
  """bool [batch, tokens], exactly round(ratio * tokens) True in each row (MAE's per-sample
  shuffle: the tokens of the lowest noise are kept)."""
  masked = int(round(ratio * tokens))
  ranks = jnp.argsort(jnp.argsort(jax.random.uniform(key, (batch, tokens)), axis=1), axis=1)
  return ranks >= tokens - masked


def masked_errors(model, images, mask, config):
  """[B] the mean squared HOG error over each image's masked tokens."""
  mf = config.maskfeat
  predicted = model({'image': images, 'mask': mask})['hog']
  target = hog.targets(images[..., 0], patch=config.model.args.patch, pool=mf.hog_pool,
                       bins=mf.hog_bins)
  per_token = jnp.mean((predicted - target) ** 2, axis=-1)
  return jnp.sum(per_token * mask, 1) / jnp.maximum(mask.sum(1), 1)


def tokens_of(config):
  side = config.input.patch_size // config.model.args.patch
  return side * side


def loss(model, batch, key, config):
  """The masked HOG error over the batch: targets from the augmented image itself, so the
  trunk learns stroke shape and direction, not the augmentation."""
  aug_key, mask_key = jax.random.split(key)
  images, _ = augment.apply(aug_key, preprocess(batch['image'], config), (), config.aug)
  mask = random_mask(mask_key, images.shape[0], tokens_of(config), config.maskfeat.mask_ratio)
  errors = masked_errors(model, images, mask, config)
  return errors.mean(), {}
