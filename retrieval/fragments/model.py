"""The patch encoder: backbone feature map -> GeM, NetVLAD or NetRVLAD pooling -> projection
-> L2, and the on-device preprocessing of its uint8 input (retrieval/features/patches.py's patches)."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bengrapheme import console, inference, input as input_lib, models
from retrieval.features import aggregate
from retrieval.fragments import data

POOLINGS = ('gem', 'netvlad', 'netrvlad')
# Patches whose backbone features the NetRVLAD centres are fitted on (k-means, before
# training); their feature vectors are subsampled to at most this many rows.
CENTRE_FIT_PATCHES, CENTRE_FIT_ROWS = 1000, 50000


class PatchEncoder(nnx.Module):
  """Backbone feature map -> pooling -> projection -> L2 normalisation.

  pooling (model.pooling):
    'gem'       generalised mean over the map, p learnt (Radenovic et al. 2018);
    'netvlad'   NetVLAD (Arandjelovic et al. 2016): per cluster k, the sum over the map's
                vectors x of a_k(x) (x - c_k), a = softmax of a linear layer, centres c
                learnt from a random start;
    'netrvlad'  the same with the centres fitted by k-means on the backbone's features of
                training patches before the first step (init_from_data) and the assignment
                free of them (NetRVLAD as SAGHOG trains it, Peer et al. 2024).
  Both VLADs normalise each cluster's residual sum (model.vlad_intra_norm; SAGHOG's code
  does not) and then the whole vector.
  """

  def __init__(self, config, rngs):
    m = config.model
    self.backbone = models.backbone(m.name, in_channels=1, pool='none', rngs=rngs,
                                    **m.args)
    features = self.backbone.features
    self.pooling, self.intra_norm = m.pooling, m.vlad_intra_norm
    if m.pooling == 'gem':
      self.gem_p = nnx.Param(jnp.array(3.0))
      pooled = features
    else:
      self.assign = nnx.Linear(features, m.netvlad_clusters, rngs=rngs)
      self.centres = nnx.Param(
          jax.random.normal(rngs.params(), (m.netvlad_clusters, features)) * 0.1)
      pooled = features * m.netvlad_clusters
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
      if self.intra_norm:
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


def init_from_data(config, workdir, graphdef, state, mesh):
  """The train state of a fresh run with NetRVLAD's centres set to k-means centres of the
  backbone's features (as initialised: pre-trained when model.init_from is set) of
  CENTRE_FIT_PATCHES training patches drawn by config.seed; any other pooling unchanged.
  The trainer calls it once, before the first step; checkpoints then carry the centres."""
  if config.model.pooling != 'netrvlad':
    return state
  src = data.source(config, workdir, 'train')
  rng = np.random.default_rng(config.seed)
  chosen = np.sort(rng.choice(len(src), min(CENTRE_FIT_PATCHES, len(src)), replace=False))
  backbone = inference.TrainedModel(
      lambda variables, images: nnx.merge(graphdef, *variables).backbone(images),
      (state['params'], state['model_state']), mesh, 0)
  fmap = inference.outputs_by_row(
      backbone, lambda forward, batch: {'map': forward(preprocess(batch['image'], config))},
      input_lib.Subset(src, chosen), batch_size=config.eval.batch_size,
      what='backbone features for the NetRVLAD centres')['map']
  rows = fmap.reshape(-1, fmap.shape[-1])
  rows = rows[rng.choice(len(rows), min(CENTRE_FIT_ROWS, len(rows)), replace=False)]
  console.say(f'NetRVLAD: k-means of {len(rows):,} feature vectors into '
              f'{config.model.netvlad_clusters} centres...')
  centres = aggregate.fit_centres(rows, config.model.netvlad_clusters, config.seed)
  state = dict(state, params=_with_centres(state['params'], centres))
  if 'ema' in state:
    state['ema'] = _with_centres(state['ema'], centres)
  return state


def _with_centres(params, centres):
  params = jax.tree.map(lambda x: x, params)  # a new tree; the leaves are shared
  old = params['centres'][...]
  params['centres'] = nnx.Param(jax.device_put(jnp.asarray(centres, old.dtype), old.sharding))
  return params

