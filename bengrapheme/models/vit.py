"""Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words") in Flax NNX:
image [B, H, W, C] -> features [B, width], or the token map [B, H / patch, W / patch, width]
with pool='none'.

The image is cut into patch x patch squares, each projected linearly to a `width`-d token;
a position embedding is added and `depth` pre-norm transformer blocks follow (x + attention
(LayerNorm(x)), then x + MLP(LayerNorm(x)), the MLP `mlp_ratio` x width wide with exact GELU),
then a final LayerNorm on every token. `position` is 'sincos', a fixed 2-D sine-cosine table
(MAE's layout, He et al. 2022: [sin x, cos x, sin y, cos y], frequencies 10000^(-k / (width /
4))), computed for whatever grid the input gives, so any input size divisible by `patch` works;
or 'learnt', one vector per patch of an `image_size` input (which the input must then be). The
defaults give the SAGHOG configuration (Peer et al. 2024): 32x32 one-channel patches cut into
4x4 sub-patches, depth 8, width 512, 8 heads.

pool: 'avg' the mean of the patch tokens (as the CNN backbones pool their feature map), 'none'
the patch tokens as a feature map (for GeM / NetVLAD heads), 'token' the class token. The final
LayerNorm comes before pooling (not after, as timm's fc_norm), so the mean and the map are of
the same tokens.
`class_token` prepends one learnt token (needed by pool='token'); pool='avg' and pool='none'
leave it out, so the map is the patch grid alone. With position='learnt' the class token has its
own position vector (timm's default layout), with 'sincos' none (MAE's zero row).

The layers are timm's VisionTransformer's (qkv_bias, LayerNorm eps 1e-6; global_pool='avg'
with fc_norm=False, or 'token'), so the forward pass matches timm's with the same weights
(tests/models/test_vit.py). Not here: dropout, stochastic depth and layer scale, which need an
RNG stream in the forward pass that the trainer does not thread through backbones. Parameters
stay float32; `dtype` sets the compute dtype (bfloat16 on accelerators); LayerNorm statistics
and the attention softmax stay float32.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

POOLS = ('avg', 'none', 'token')
POSITIONS = ('sincos', 'learnt')
_EMBEDDING_INIT = nnx.initializers.normal(0.02)  # MAE's class token, timm's position table


@functools.lru_cache(maxsize=None)
def sincos_table(height, width, dim, temperature=10000.0):
  """[height * width, dim] float32, row-major tokens: MAE's get_2d_sincos_pos_embed."""
  if dim % 4:
    raise ValueError(f'model.width={dim}: a 2-D sine-cosine position embedding needs a width '
                     'divisible by 4')
  omega = 1.0 / temperature**(np.arange(dim // 4) / (dim // 4))
  y, x = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
  x, y = np.outer(x.ravel(), omega), np.outer(y.ravel(), omega)
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


def _linear(cin, cout, dtype, rngs):
  # MAE's init: Xavier-uniform kernels, zero biases.
  return nnx.Linear(cin, cout, dtype=dtype, kernel_init=nnx.initializers.xavier_uniform(),
                    rngs=rngs)


def _norm(width, dtype, rngs):
  # Two-pass variance: E[x^2] - E[x]^2 cancels badly once the residual stream's mean is
  # large next to its spread, and PyTorch's LayerNorm (the reference) is two-pass too.
  return nnx.LayerNorm(width, epsilon=1e-6, dtype=dtype, use_fast_variance=False, rngs=rngs)


class Attention(nnx.Module):
  """Multi-head self-attention with one fused qkv projection (timm's layout)."""

  def __init__(self, width, heads, *, dtype, rngs):
    self.heads = heads
    self.qkv = _linear(width, 3 * width, dtype, rngs)
    self.proj = _linear(width, width, dtype, rngs)

  def __call__(self, x):
    batch, tokens, width = x.shape
    q, k, v = jnp.unstack(self.qkv(x).reshape(batch, tokens, 3, self.heads, -1), axis=2)
    # Logits and softmax in float32 whatever the compute dtype (jax.nn's XLA path).
    y = jax.nn.dot_product_attention(q, k, v)
    return self.proj(y.reshape(batch, tokens, width))


class Mlp(nnx.Module):

  def __init__(self, width, hidden, *, dtype, rngs):
    self.fc1 = _linear(width, hidden, dtype, rngs)
    self.fc2 = _linear(hidden, width, dtype, rngs)

  def __call__(self, x):
    return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))  # timm's nn.GELU: exact


class Block(nnx.Module):
  """Pre-norm (Xiong et al. 2020): each branch sees a normalised input but the residual
  stream is never normalised, so gradients reach the early blocks undiminished and training
  needs no long learning-rate warm-up."""

  def __init__(self, width, heads, mlp_ratio, *, dtype, rngs):
    self.norm1 = _norm(width, dtype, rngs)
    self.attn = Attention(width, heads, dtype=dtype, rngs=rngs)
    self.norm2 = _norm(width, dtype, rngs)
    self.mlp = Mlp(width, int(width * mlp_ratio), dtype=dtype, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.norm1(x))
    return x + self.mlp(self.norm2(x))


def _pair(size):
  return (size, size) if isinstance(size, int) else tuple(size)


class Model(nnx.Module):
  """ViT trunk; `features` is the token width."""

  def __init__(self, *, patch=4, depth=8, width=512, heads=8, mlp_ratio=4.0, in_channels=1,
               position='sincos', image_size=32, class_token=False, pool='avg',
               dtype='float32', rngs):
    if pool not in POOLS:
      raise ValueError(f'model.pool={pool!r}: expected one of {POOLS}')
    if pool == 'token' and not class_token:
      raise ValueError("model.pool='token' needs model.class_token=True")
    if position not in POSITIONS:
      raise ValueError(f'model.position={position!r}: expected one of {POSITIONS}')
    if width % heads:
      raise ValueError(f'model.width={width} is not divisible by model.heads={heads}')
    if position == 'sincos':
      sincos_table(1, 1, width)  # a width not divisible by 4 fails here, not at the first step
    dtype = jnp.dtype(dtype)
    self.patch, self.pool = patch, pool
    self.patch_embed = nnx.Conv(
        in_channels, width, (patch, patch), strides=patch, padding='VALID', dtype=dtype,
        # MAE's init: Xavier-uniform over the kernel seen as a [patch * patch * C, width] matrix.
        kernel_init=nnx.initializers.variance_scaling(1.0, 'fan_avg', 'uniform',
                                                      in_axis=(0, 1, 2), out_axis=-1),
        rngs=rngs)
    self.cls_token = None
    if class_token:
      self.cls_token = nnx.data(nnx.Param(_EMBEDDING_INIT(rngs.params(), (1, 1, width))))
    self.grid = self.pos_embed = None
    if position == 'learnt':
      height, image_width = _pair(image_size)
      if height % patch or image_width % patch:
        raise ValueError(f'model.image_size={image_size} is not divisible by '
                         f'model.patch={patch}')
      self.grid = (height // patch, image_width // patch)
      tokens = self.grid[0] * self.grid[1] + (1 if class_token else 0)
      self.pos_embed = nnx.data(nnx.Param(_EMBEDDING_INIT(rngs.params(), (1, tokens, width))))
    self.blocks = nnx.List([Block(width, heads, mlp_ratio, dtype=dtype, rngs=rngs)
                            for _ in range(depth)])
    self.norm = _norm(width, dtype, rngs)
    self.features = width

  def __call__(self, x, train=False, mask=None, mask_token=None):
    """mask [B, tokens] bool, with mask_token [width]: the masked patches' tokens are
    replaced by mask_token before the position embedding (MaskFeat's input, Wei et al.
    2022). The token is the caller's parameter, so the trunk's parameters are the same
    with or without masking and a pre-trained trunk loads into a fine-tuned model as is."""
    del train  # no dropout or batch statistics
    batch, height, width = x.shape[:3]
    if height % self.patch or width % self.patch:
      raise ValueError(f'a {height}x{width} input is not divisible into '
                       f'model.patch={self.patch} patches')
    grid = (height // self.patch, width // self.patch)
    if self.grid is not None and grid != self.grid:
      raise ValueError(f'a {height}x{width} input gives a {grid[0]}x{grid[1]} patch grid; the '
                       f'learnt position embedding is for {self.grid[0]}x{self.grid[1]} '
                       '(model.image_size)')
    x = self.patch_embed(x).reshape(batch, grid[0] * grid[1], -1)
    if mask is not None:
      x = jnp.where(mask[..., None], jnp.asarray(mask_token, x.dtype), x)
    if self.pos_embed is None:
      x = x + jnp.asarray(sincos_table(*grid, x.shape[-1]), x.dtype)
    prefix = 0
    if self.cls_token is not None:
      prefix = 1
      cls = jnp.broadcast_to(self.cls_token[...].astype(x.dtype), (batch, 1, x.shape[-1]))
      x = jnp.concatenate([cls, x], axis=1)
    if self.pos_embed is not None:
      x = x + self.pos_embed[...].astype(x.dtype)
    for block in self.blocks:
      x = block(x)
    x = self.norm(x)
    if self.pool == 'token':
      return x[:, 0].astype(jnp.float32)
    x = x[:, prefix:]
    if self.pool == 'none':  # feature map for pooling heads such as GeM / NetVLAD
      return x.reshape(batch, *grid, x.shape[-1])
    return jnp.mean(x.astype(jnp.float32), axis=1)
