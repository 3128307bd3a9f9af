"""The patch encoder: backbone feature map -> GeM or NetVLAD pooling -> projection -> L2,
and the on-device preprocessing of its uint8 input (retrieval/patches.py's patches)."""
import jax
import jax.numpy as jnp
from flax import nnx

from bengrapheme import models


class PatchEncoder(nnx.Module):
  """Backbone feature map -> GeM (or NetVLAD) pooling -> projection -> L2 normalisation."""

  def __init__(self, config, rngs):
    m = config.model
    self.backbone = models.backbone(m.name, in_channels=1, pool='none', rngs=rngs,
                                    **m.args)
    features = self.backbone.features
    self.pooling = m.pooling
    if m.pooling == 'gem':  # generalised mean; p is learnt (Radenovic et al. 2018)
      self.gem_p = nnx.Param(jnp.array(3.0))
      pooled = features
    elif m.pooling == 'netvlad':  # Arandjelovic et al. 2016
      self.assign = nnx.Linear(features, m.netvlad_clusters, rngs=rngs)
      self.centres = nnx.Param(
          jax.random.normal(rngs.params(), (m.netvlad_clusters, features)) * 0.1)
      pooled = features * m.netvlad_clusters
    else:
      raise ValueError(f"model.pooling={m.pooling!r}: expected 'gem' or 'netvlad'")
    self.projection = nnx.Linear(pooled, m.embedding_dim, rngs=rngs)

  def __call__(self, x, train=False):
    fmap = self.backbone(x, train=train).astype(jnp.float32)  # [B, h, w, F]
    if self.pooling == 'gem':
      p = jnp.maximum(self.gem_p[...], 1.0)
      pooled = jnp.mean(jnp.maximum(fmap, 1e-6) ** p, axis=(1, 2)) ** (1.0 / p)
    else:
      flat = fmap.reshape(fmap.shape[0], -1, fmap.shape[-1])  # [B, n, F]
      soft = jax.nn.softmax(self.assign(flat), -1)  # [B, n, K]
      residuals = jnp.einsum('bnk,bnf->bkf', soft, flat) - (
          soft.sum(1)[..., None] * self.centres[...][None])
      residuals = residuals / (jnp.linalg.norm(residuals, axis=-1, keepdims=True) + 1e-6)
      pooled = residuals.reshape(residuals.shape[0], -1)
      pooled = pooled / (jnp.linalg.norm(pooled, axis=-1, keepdims=True) + 1e-6)
    embedding = self.projection(pooled)
    return embedding / (jnp.linalg.norm(embedding, axis=-1, keepdims=True) + 1e-6)


def make_model(config, rngs):
  return PatchEncoder(config, rngs)


def preprocess(images, config):
  """uint8 patches [B, S, S, C] (ink 255) -> float32 in [0, 1], ink high and background 0
  (augmentation then fills with background)."""
  del config
  return images.astype(jnp.float32) / 255.0
