"""The MaskFeat pre-training model: a ViT trunk (bengrapheme/models/vit.py) that sees the
masked sub-patches as a learnt mask token, and a linear head predicting every token's HOG
target (retrieval/maskfeat/hog.py). Its `backbone` is the fragment encoder's: a fine-tune
with model.init_from naming the pre-training workdir starts from it (train.init_state)."""
import jax.numpy as jnp
from flax import nnx

from bengrapheme import models
from retrieval.maskfeat import hog


class MaskFeat(nnx.Module):

  def __init__(self, config, rngs):
    m, mf = config.model, config.maskfeat
    self.backbone = models.backbone(m.name, in_channels=1, pool='none', rngs=rngs, **m.args)
    width = self.backbone.features
    # Normal(0.02), as MAE's and MaskFeat's mask token.
    self.mask_token = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (width,)))
    self.head = nnx.Linear(width, hog.dims(self.backbone.patch, mf.hog_pool, mf.hog_bins),
                           rngs=rngs)

  def __call__(self, inputs, train=False):
    """inputs: {'image': float [B, S, S, 1], 'mask': bool [B, tokens] or absent}.
    Returns {'hog': [B, tokens, D] predictions, 'features': [B, width] the mean token}."""
    tokens = self.backbone(inputs['image'], train=train, mask=inputs.get('mask'),
                           mask_token=self.mask_token[...])
    tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1]).astype(jnp.float32)
    return {'hog': self.head(tokens), 'features': tokens.mean(1)}


def make_model(config, rngs):
  return MaskFeat(config, rngs)
