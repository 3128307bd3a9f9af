"""CIFAR-style ResNets (He et al. 2016, section 4.2) for small inputs such as 32x32 patches.

depth = 6n + 2: a 3x3 stem and three stages of n basic blocks at width, 2 x width and
4 x width channels, the last two starting with a stride 2 (ResNet-20: n = 3, ~0.27 M
parameters at width 16). The writer-retrieval methods that learn from 32x32 patches at
handwriting keypoints use this family (Christlein et al. 2017; Peer et al. 2023: ResNet-20/56).
The blocks are bengrapheme/models/resnet.py's.
"""
import jax.numpy as jnp
from flax import nnx

from bengrapheme.models.resnet import BasicBlock, _conv, _norm


class Model(nnx.Module):
  """CIFAR ResNet trunk; `features` is the channel count of the last stage."""

  def __init__(self, *, depth=20, width=16, in_channels=1, pool='avg', dtype='float32',
               rngs):
    if depth < 8 or (depth - 2) % 6:
      raise ValueError(f'model.depth={depth}: a CIFAR ResNet has depth 6n + 2 (20, 32, 56)')
    if pool not in ('avg', 'none'):
      raise ValueError(f"model.pool={pool!r}: expected 'avg' or 'none'")
    dtype = jnp.dtype(dtype)
    self.pool = pool
    self.stem_conv = _conv(in_channels, width, 3, 1, dtype, rngs)
    self.stem_norm = _norm(width, dtype, rngs)
    blocks, cin = [], width
    for stage in range(3):
      for i in range((depth - 2) // 6):
        stride = 2 if i == 0 and stage > 0 else 1
        blocks.append(BasicBlock(cin, width * 2**stage, stride, dtype=dtype, rngs=rngs))
        cin = width * 2**stage
    self.blocks = nnx.List(blocks)
    self.features = cin

  def __call__(self, x, train=False):
    x = nnx.relu(self.stem_norm(self.stem_conv(x), use_running_average=not train))
    for block in self.blocks:
      x = block(x, train)
    if self.pool == 'none':  # feature map for pooling heads such as GeM / NetVLAD
      return x
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))
