"""SE-ResNeXt backbones (Xie et al. 2017; Hu et al. 2018) in Flax NNX: image [B, H, W, C] ->
features [B, D], or the feature map with pool='none'.

timm's seresnext50_32x4d / seresnext101_32x4d layer for layer (its names, so its published
weights load through `model.init_from`, bengrapheme/models/pytorch_weights.py): the ImageNet
stem (7x7 stride-2 conv + 3x3 stride-2 max-pool), bottlenecks whose 3x3 conv is split into
`cardinality` groups of `group_width` x stage channels, and a squeeze-and-excitation gate on
each residual branch before the sum. Convolutions pad symmetrically as PyTorch does (what the
weights were trained with). The 10th Bengali.AI solution used SE-ResNeXt50. Parameters stay
float32; `dtype` sets the compute dtype (bfloat16 on accelerators).
"""
import jax
import jax.numpy as jnp
from flax import nnx

from bengrapheme.models.resnet import LAYOUTS, Shortcut, _conv, _norm, check_args
from bengrapheme.models.resnet import max_pool_3x3_s2, resnet_layers

DEPTHS = (50, 101)


class SqueezeExcite(nnx.Module):
  """x * sigmoid(expand(act(reduce(mean over H, W of x)))): a gate per channel.

  The two 1x1 convolutions of the PyTorch layer act on a [B, C] vector here, so they are
  Linear layers (pytorch_weights.py reshapes their [out, in, 1, 1] weights)."""

  def __init__(self, channels, reduced, act, *, dtype, rngs):
    self.reduce = nnx.Linear(channels, reduced, dtype=dtype, rngs=rngs)
    self.expand = nnx.Linear(reduced, channels, dtype=dtype, rngs=rngs)
    self.act = act

  def __call__(self, x):
    squeezed = jnp.mean(x.astype(jnp.float32), axis=(1, 2))  # f32: a sum over H x W pixels
    gate = jax.nn.sigmoid(self.expand(self.act(self.reduce(squeezed))))
    return x * gate[:, None, None, :].astype(x.dtype)

  def pytorch_layers(self, reduce_name, expand_name):
    return [(reduce_name, self.reduce), (expand_name, self.expand)]


def se_channels(channels, ratio=1 / 16, divisor=8):
  """timm's make_divisible(channels * ratio, 8, round_limit=0) for SEModule."""
  return max(divisor, int(channels * ratio + divisor / 2) // divisor * divisor)


class SEBottleneck(nnx.Module):

  def __init__(self, cin, channels, stride, cardinality, group_width, *, dtype, rngs):
    width = channels * group_width // 64 * cardinality  # timm: floor(planes * bw / 64) * card
    cout = channels * 4
    self.conv1 = _conv(cin, width, 1, 1, dtype, rngs, 'symmetric')
    self.norm1 = _norm(width, dtype, rngs)
    self.conv2 = _conv(width, width, 3, stride, dtype, rngs, 'symmetric', groups=cardinality)
    self.norm2 = _norm(width, dtype, rngs)
    self.conv3 = _conv(width, cout, 1, 1, dtype, rngs, 'symmetric')
    self.norm3 = _norm(cout, dtype, rngs, zero_init=True)
    self.se = SqueezeExcite(cout, se_channels(cout), nnx.relu, dtype=dtype, rngs=rngs)
    self.shortcut = Shortcut(cin, cout, stride, dtype=dtype, rngs=rngs, padding='symmetric')

  def __call__(self, x, train):
    y = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
    y = nnx.relu(self.norm2(self.conv2(y), use_running_average=not train))
    y = self.se(self.norm3(self.conv3(y), use_running_average=not train))
    return nnx.relu(self.shortcut(x, train) + y)

  def pytorch_layers(self, prefix):
    return [(f'{prefix}.conv1', self.conv1), (f'{prefix}.bn1', self.norm1),
            (f'{prefix}.conv2', self.conv2), (f'{prefix}.bn2', self.norm2),
            (f'{prefix}.conv3', self.conv3), (f'{prefix}.bn3', self.norm3),
            *self.se.pytorch_layers(f'{prefix}.se.fc1', f'{prefix}.se.fc2'),
            *self.shortcut.pytorch_layers(prefix)]


class Model(nnx.Module):
  """SE-ResNeXt trunk; `features` is the pooled feature size (2,048)."""

  def __init__(self, *, depth=50, cardinality=32, group_width=4, in_channels=1, pool='avg',
               dtype='float32', rngs):
    if depth not in DEPTHS:
      raise ValueError(f'model.depth={depth}: expected one of {DEPTHS} for se_resnext')
    check_args(pool)
    dtype = jnp.dtype(dtype)
    self.pool, self.counts = pool, LAYOUTS[depth][1]
    self.stem_conv = _conv(in_channels, 64, 7, 2, dtype, rngs, 'symmetric')
    self.stem_norm = _norm(64, dtype, rngs)
    blocks, cin = [], 64
    for stage, count in enumerate(self.counts):
      channels = 64 * 2**stage
      for i in range(count):
        stride = 2 if i == 0 and stage > 0 else 1
        blocks.append(SEBottleneck(cin, channels, stride, cardinality, group_width,
                                   dtype=dtype, rngs=rngs))
        cin = channels * 4
    self.blocks = nnx.List(blocks)
    self.features = cin

  def __call__(self, x, train=False):
    x = nnx.relu(self.stem_norm(self.stem_conv(x), use_running_average=not train))
    x = max_pool_3x3_s2(x, 'symmetric')
    for block in self.blocks:
      x = block(x, train)
    if self.pool == 'none':  # feature map for pooling heads such as GeM / NetVLAD
      return x
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))

  def pytorch_namings(self):
    """{naming: (PyTorch layer names in forward order, classifier prefix)} for
    pytorch_weights.py: timm's seresnext names (torchvision has no SE-ResNeXt)."""
    return {'timm': (resnet_layers(self, self.counts), 'fc.')}
