"""ResNet backbones (He et al. 2016) in Flax NNX: image [B, H, W, C] -> features [B, D].

`depth` picks the block layout (10/18/34 basic blocks, 50/101 bottlenecks); `width` is the
channel count of the first stage (64 in the paper). The `small` stem (3x3 conv, no max-pool)
keeps detail in low-resolution inputs such as 64x112 graphemes; the `imagenet` stem (7x7
stride-2 conv + max-pool) is the paper's. Parameters stay float32; `dtype` sets the compute
dtype (bfloat16 on accelerators).
"""
import jax.numpy as jnp
from flax import nnx

LAYOUTS = {
    10: ('basic', (1, 1, 1, 1)),
    18: ('basic', (2, 2, 2, 2)),
    34: ('basic', (3, 4, 6, 3)),
    50: ('bottleneck', (3, 4, 6, 3)),
    101: ('bottleneck', (3, 4, 23, 3)),
}


def _conv(cin, cout, kernel, stride, dtype, rngs):
  return nnx.Conv(cin, cout, (kernel, kernel), strides=stride, padding='SAME',
                  use_bias=False, dtype=dtype, rngs=rngs)


def _norm(channels, dtype, rngs, zero_init=False):
  # Zero-initialising the last norm of each residual branch makes every block start as the
  # identity, which trains faster and more stably (Goyal et al. 2017).
  scale_init = nnx.initializers.zeros if zero_init else nnx.initializers.ones
  return nnx.BatchNorm(channels, momentum=0.9, dtype=dtype, scale_init=scale_init,
                       rngs=rngs)


class Shortcut(nnx.Module):
  """The residual path: identity, or a 1x1 projection when the shape changes."""

  def __init__(self, cin, cout, stride, *, dtype, rngs):
    self.conv = self.norm = None
    if stride != 1 or cin != cout:
      self.conv = nnx.data(_conv(cin, cout, 1, stride, dtype, rngs))
      self.norm = nnx.data(_norm(cout, dtype, rngs))

  def __call__(self, x, train):
    if self.conv is None:
      return x
    return self.norm(self.conv(x), use_running_average=not train)


class BasicBlock(nnx.Module):
  expansion = 1

  def __init__(self, cin, channels, stride, *, dtype, rngs):
    cout = channels * self.expansion
    self.conv1 = _conv(cin, channels, 3, stride, dtype, rngs)
    self.norm1 = _norm(channels, dtype, rngs)
    self.conv2 = _conv(channels, cout, 3, 1, dtype, rngs)
    self.norm2 = _norm(cout, dtype, rngs, zero_init=True)
    self.shortcut = Shortcut(cin, cout, stride, dtype=dtype, rngs=rngs)

  def __call__(self, x, train):
    y = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
    y = self.norm2(self.conv2(y), use_running_average=not train)
    return nnx.relu(self.shortcut(x, train) + y)


class Bottleneck(nnx.Module):
  expansion = 4

  def __init__(self, cin, channels, stride, *, dtype, rngs):
    cout = channels * self.expansion
    self.conv1 = _conv(cin, channels, 1, 1, dtype, rngs)
    self.norm1 = _norm(channels, dtype, rngs)
    self.conv2 = _conv(channels, channels, 3, stride, dtype, rngs)
    self.norm2 = _norm(channels, dtype, rngs)
    self.conv3 = _conv(channels, cout, 1, 1, dtype, rngs)
    self.norm3 = _norm(cout, dtype, rngs, zero_init=True)
    self.shortcut = Shortcut(cin, cout, stride, dtype=dtype, rngs=rngs)

  def __call__(self, x, train):
    y = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
    y = nnx.relu(self.norm2(self.conv2(y), use_running_average=not train))
    y = self.norm3(self.conv3(y), use_running_average=not train)
    return nnx.relu(self.shortcut(x, train) + y)


class Model(nnx.Module):
  """ResNet trunk; `features` is the pooled feature size."""

  def __init__(self, *, depth=18, width=64, in_channels=1, stem='small',
               pool='avg', dtype='float32', rngs):
    if depth not in LAYOUTS:
      raise ValueError(f'model.depth={depth}: expected one of {sorted(LAYOUTS)}')
    if stem not in ('small', 'imagenet'):
      raise ValueError(f"model.stem={stem!r}: expected 'small' or 'imagenet'")
    if pool not in ('avg', 'none'):
      raise ValueError(f"model.pool={pool!r}: expected 'avg' or 'none'")
    dtype = jnp.dtype(dtype)
    kind, counts = LAYOUTS[depth]
    block = BasicBlock if kind == 'basic' else Bottleneck
    self.stem_kind, self.pool = stem, pool
    kernel, stride = (3, 1) if stem == 'small' else (7, 2)
    self.stem_conv = _conv(in_channels, width, kernel, stride, dtype, rngs)
    self.stem_norm = _norm(width, dtype, rngs)
    blocks, cin = [], width
    for stage, count in enumerate(counts):
      channels = width * 2**stage
      for i in range(count):
        stride = 2 if (i == 0 and (stage > 0 or stem == 'small')) else 1
        blocks.append(block(cin, channels, stride, dtype=dtype, rngs=rngs))
        cin = channels * block.expansion
    self.blocks = nnx.List(blocks)
    self.features = cin

  def __call__(self, x, train=False):
    x = nnx.relu(self.stem_norm(self.stem_conv(x), use_running_average=not train))
    if self.stem_kind == 'imagenet':
      x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding='SAME')
    for block in self.blocks:
      x = block(x, train)
    if self.pool == 'none':  # feature map for pooling heads such as GeM / NetVLAD
      return x
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))
