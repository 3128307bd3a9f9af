"""EfficientNet-B0..B3 (Tan & Le 2019) in Flax NNX: image [B, H, W, C] -> features [B, D], or
the feature map with pool='none'.

timm's efficientnet_b0..b3 (and torchvision's efficientnet_b0..b3, the same network) layer for
layer, so their published weights load through `model.init_from` under either naming
(bengrapheme/models/pytorch_weights.py): a 3x3 stride-2 stem, seven stages of mobile inverted
bottlenecks (1x1 expansion, depthwise kxk, squeeze-and-excitation, 1x1 projection; the first
stage has no expansion), a 1x1 head conv, SiLU throughout. `variant` scales B0's widths and
depths as timm does. Convolutions pad symmetrically as PyTorch does (what the weights were
trained with). The 1st and 8th Bengali.AI solutions used EfficientNets. Parameters stay
float32; `dtype` sets the compute dtype (bfloat16 on accelerators).

Not here: timm's training-time stochastic depth (drop_path), which needs an RNG stream in the
forward pass that the trainer does not thread through backbones.
"""
import math

import jax.numpy as jnp
from flax import nnx
from jax import lax

from bengrapheme.models import depthwise
from bengrapheme.models.resnet import _conv, _conv_general_dilated, _norm, check_args, conv_padding
from bengrapheme.models.se_resnext import SqueezeExcite

# variant: (channel multiplier, depth multiplier), as in timm's _gen_efficientnet.
VARIANTS = {'b0': (1.0, 1.0), 'b1': (1.0, 1.1), 'b2': (1.1, 1.2), 'b3': (1.2, 1.4)}
# B0's stages: (repeats, kernel, stride of the first block, expansion, output channels).
STAGES = ((1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
          (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320))
STEM, HEAD, SE_RATIO = 32, 1280, 0.25


def round_channels(channels, multiplier, divisor=8):
  """timm's round_channels: the nearest multiple of 8, never below 90 % of the target."""
  v = channels * multiplier
  rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
  return rounded + divisor if rounded < 0.9 * v else rounded


def _depthwise_conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                    dimension_numbers=None, feature_group_count=1, precision=None, **kwargs):
  """lax.conv_general_dilated for NHWC x HWIO convolutions; on CPU a depthwise one (one
  group per channel) is depthwise.conv, since XLA's CPU backend runs grouped convolutions
  slowly and depthwise layers are most of an EfficientNet. GPUs and TPUs keep their native
  depthwise kernels.
  """
  if (feature_group_count != lhs.shape[-1] or rhs.shape[2:] != (1, lhs.shape[-1])
      or any(d != 1 for d in (*(lhs_dilation or ()), *(rhs_dilation or ())))):
    return _conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                 dimension_numbers, feature_group_count, precision=precision,
                                 **kwargs)

  def native(x, w):
    return lax.conv_general_dilated(x, w, window_strides, padding, lhs_dilation, rhs_dilation,
                                    dimension_numbers, feature_group_count, precision=precision,
                                    **kwargs)

  return lax.platform_dependent(
      lhs, rhs, cpu=lambda x, w: depthwise.conv(x, w, window_strides, padding), default=native)


class MBConv(nnx.Module):
  """Mobile inverted bottleneck; with expansion 1 (the first stage) there is no 1x1 expansion
  (timm's DepthwiseSeparableConv). The residual is kept when the shape is."""

  def __init__(self, cin, cout, kernel, stride, expansion, *, dtype, rngs):
    mid = cin * expansion
    self.expand_conv = self.expand_norm = None
    if expansion != 1:
      self.expand_conv = nnx.data(_conv(cin, mid, 1, 1, dtype, rngs, 'symmetric'))
      self.expand_norm = nnx.data(_norm(mid, dtype, rngs))
    self.dw_conv = nnx.Conv(mid, mid, (kernel, kernel), strides=stride,
                            padding=conv_padding(kernel, stride, 'symmetric'),
                            feature_group_count=mid, use_bias=False, dtype=dtype,
                            conv_general_dilated=_depthwise_conv, rngs=rngs)
    self.dw_norm = _norm(mid, dtype, rngs)
    # The gate squeezes to a quarter of the block's input channels, whatever the expansion.
    self.se = SqueezeExcite(mid, max(1, int(cin * SE_RATIO)), nnx.silu, dtype=dtype,
                            rngs=rngs)
    self.project_conv = _conv(mid, cout, 1, 1, dtype, rngs, 'symmetric')
    self.project_norm = _norm(cout, dtype, rngs)
    self.residual = stride == 1 and cin == cout

  def __call__(self, x, train):
    y = x
    if self.expand_conv is not None:
      y = nnx.silu(self.expand_norm(self.expand_conv(y), use_running_average=not train))
    y = nnx.silu(self.dw_norm(self.dw_conv(y), use_running_average=not train))
    y = self.project_norm(self.project_conv(self.se(y)), use_running_average=not train)
    return x + y if self.residual else y

  def timm_layers(self, p):
    if self.expand_conv is None:  # DepthwiseSeparableConv
      return [(f'{p}.conv_dw', self.dw_conv), (f'{p}.bn1', self.dw_norm),
              *self.se.pytorch_layers(f'{p}.se.conv_reduce', f'{p}.se.conv_expand'),
              (f'{p}.conv_pw', self.project_conv), (f'{p}.bn2', self.project_norm)]
    return [(f'{p}.conv_pw', self.expand_conv), (f'{p}.bn1', self.expand_norm),
            (f'{p}.conv_dw', self.dw_conv), (f'{p}.bn2', self.dw_norm),
            *self.se.pytorch_layers(f'{p}.se.conv_reduce', f'{p}.se.conv_expand'),
            (f'{p}.conv_pwl', self.project_conv), (f'{p}.bn3', self.project_norm)]

  def torchvision_layers(self, p):  # p.block: [expansion], depthwise, SE, projection
    convs = [] if self.expand_conv is None else [(self.expand_conv, self.expand_norm)]
    convs += [(self.dw_conv, self.dw_norm)]
    layers = [layer for i, (conv, norm) in enumerate(convs)
              for layer in ((f'{p}.block.{i}.0', conv), (f'{p}.block.{i}.1', norm))]
    n = len(convs)
    return [*layers, *self.se.pytorch_layers(f'{p}.block.{n}.fc1', f'{p}.block.{n}.fc2'),
            (f'{p}.block.{n + 1}.0', self.project_conv), (f'{p}.block.{n + 1}.1',
                                                         self.project_norm)]


class Model(nnx.Module):
  """EfficientNet trunk; `features` is the head conv's width (1,280 for B0, 1,536 for B3)."""

  def __init__(self, *, variant='b0', in_channels=1, pool='avg', dtype='float32', rngs):
    if variant not in VARIANTS:
      raise ValueError(f'model.variant={variant!r}: expected one of {sorted(VARIANTS)}')
    check_args(pool)
    dtype = jnp.dtype(dtype)
    width, depth = VARIANTS[variant]
    self.pool = pool
    stem = round_channels(STEM, width)
    self.stem_conv = _conv(in_channels, stem, 3, 2, dtype, rngs, 'symmetric')
    self.stem_norm = _norm(stem, dtype, rngs)
    blocks, self.stage_sizes, cin = [], [], stem
    for repeats, kernel, stride, expansion, channels in STAGES:
      cout = round_channels(channels, width)
      count = math.ceil(repeats * depth)
      for i in range(count):
        blocks.append(MBConv(cin, cout, kernel, stride if i == 0 else 1, expansion,
                             dtype=dtype, rngs=rngs))
        cin = cout
      self.stage_sizes.append(count)
    self.blocks = nnx.List(blocks)
    self.features = round_channels(HEAD, width)
    self.head_conv = _conv(cin, self.features, 1, 1, dtype, rngs, 'symmetric')
    self.head_norm = _norm(self.features, dtype, rngs)

  def __call__(self, x, train=False):
    x = nnx.silu(self.stem_norm(self.stem_conv(x), use_running_average=not train))
    for block in self.blocks:
      x = block(x, train)
    x = nnx.silu(self.head_norm(self.head_conv(x), use_running_average=not train))
    if self.pool == 'none':  # feature map for pooling heads such as GeM / NetVLAD
      return x
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))

  def pytorch_namings(self):
    """{naming: ((PyTorch name prefix, layer) in forward order, classifier prefix)} for
    pytorch_weights.py: timm's names, or torchvision's (features.N..., classifier.1)."""
    names = [(stage, i) for stage, count in enumerate(self.stage_sizes) for i in range(count)]
    timm = [('conv_stem', self.stem_conv), ('bn1', self.stem_norm)]
    tv = [('features.0.0', self.stem_conv), ('features.0.1', self.stem_norm)]
    for (stage, i), block in zip(names, self.blocks, strict=True):
      timm += block.timm_layers(f'blocks.{stage}.{i}')
      tv += block.torchvision_layers(f'features.{stage + 1}.{i}')
    head = len(self.stage_sizes) + 1
    timm += [('conv_head', self.head_conv), ('bn2', self.head_norm)]
    tv += [(f'features.{head}.0', self.head_conv), (f'features.{head}.1', self.head_norm)]
    return {'timm': (timm, 'classifier.'), 'torchvision': (tv, 'classifier.1.')}
