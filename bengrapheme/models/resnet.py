"""ResNet backbones (He et al. 2016) in Flax NNX: image [B, H, W, C] -> features [B, D].

`depth` picks the block layout (10/18/34 basic blocks, 50/101 bottlenecks); `width` is the
channel count of the first stage (64 in the paper). The `small` stem (3x3 conv, no max-pool)
keeps detail in low-resolution inputs such as 64x112 graphemes; the `imagenet` stem (7x7
stride-2 conv + max-pool) is the paper's. Parameters stay float32; `dtype` sets the compute
dtype (bfloat16 on accelerators).

With `stem='imagenet', width=64, padding='symmetric'` the layers are torchvision's (and timm's)
resnet18/34/50/101 exactly, so their published weights load through `model.init_from`
(bengrapheme/models/pytorch_weights.py). `padding` is how a strided layer pads an even-sized
input: 'same' (XLA's: one pixel after) or 'symmetric' (PyTorch's: k // 2 on both sides, what
those weights were trained with). For odd sizes the two agree.
"""
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

LAYOUTS = {
    10: ('basic', (1, 1, 1, 1)),
    18: ('basic', (2, 2, 2, 2)),
    34: ('basic', (3, 4, 6, 3)),
    50: ('bottleneck', (3, 4, 6, 3)),
    101: ('bottleneck', (3, 4, 23, 3)),
}


def _conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                          rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                          precision=None, **kwargs):
  """lax.conv_general_dilated for our NHWC x HWIO convolutions, as patches @ kernel when the
  output has fewer pixels than the kernel has taps.

  XLA swaps the operands of such a convolution (a 3x3 kernel over a 2x3 map, as in the last
  stage of the 56x96 demo model, or the input gradient of a stride-2 conv producing one) and
  the swapped form falls off the fast CPU path onto a naive loop: those three convolutions
  took 34 % of the demo's training step. Gathering the k*k shifted slices and multiplying
  by the kernel costs little at that size, and its gradient is slices, pads and matmuls.
  """
  kh, kw = rhs.shape[:2]
  pads = (lax.padtype_to_pads(lhs.shape[1:3], (kh, kw), window_strides, padding)
          if isinstance(padding, str) else padding)
  out_h, out_w = [(n + lo + hi - k) // s + 1 for n, k, s, (lo, hi)
                  in zip(lhs.shape[1:3], (kh, kw), window_strides, pads)]
  plain = (feature_group_count != 1 or any(d != 1 for d in (lhs_dilation or ()))
           or any(d != 1 for d in (rhs_dilation or ())) or out_h * out_w >= kh * kw)
  if plain:
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation,
                                    rhs_dilation, dimension_numbers, feature_group_count,
                                    precision=precision, **kwargs)
  x = jnp.pad(lhs, ((0, 0), *pads, (0, 0)))
  sh, sw = window_strides
  patches = jnp.concatenate(  # [B, out_h, out_w, kh * kw * C], tap-major like the HWIO kernel
      [x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw]
       for i in range(kh) for j in range(kw)], axis=-1)
  return jnp.dot(patches, rhs.reshape(-1, rhs.shape[-1]), precision=precision)


PADDINGS = ('same', 'symmetric')


def conv_padding(kernel, stride, padding):
  """nnx.Conv's padding for model.padding ('same' or 'symmetric', see the module doc)."""
  if padding == 'same':
    return 'SAME'
  p = (stride - 1 + kernel - 1) // 2  # PyTorch's k // 2 for odd k; timm's get_padding
  return ((p, p), (p, p))


def _conv(cin, cout, kernel, stride, dtype, rngs, padding='same', groups=1):
  return nnx.Conv(cin, cout, (kernel, kernel), strides=stride,
                  padding=conv_padding(kernel, stride, padding), feature_group_count=groups,
                  use_bias=False, dtype=dtype, conv_general_dilated=_conv_general_dilated,
                  rngs=rngs)


def _pool_pads(height, width, padding):
  """(top, left) padding of the 3x3 stride-2 max-pool. Both kinds give ceil(n / 2) outputs;
  PyTorch's MaxPool2d(3, 2, padding=1) always pads one pixel before."""
  if padding == 'symmetric':
    return 1, 1
  (top, _), (left, _) = lax.padtype_to_pads((height, width), (3, 3), (2, 2), 'SAME')
  return top, left


def _pool_phases(x, padding):
  """Pads x [B, H, W, C] with -inf for a 3x3 stride-2 window and splits rows and columns
  by parity: [B, Ho + 1, 2, Wo + 1, 2, C]. Tap (i, j) of output pixel (r, c) is then
  phases[:, r + i // 2, i % 2, c + j // 2, j % 2], so every tap is a plain slice."""
  batch, height, width, channels = x.shape
  out_h, out_w = -(-height // 2), -(-width // 2)
  top, left = _pool_pads(height, width, padding)
  x = jnp.pad(x, ((0, 0), (top, 2 * out_h + 2 - height - top),
                  (left, 2 * out_w + 2 - width - left), (0, 0)), constant_values=-jnp.inf)
  return x.reshape(batch, out_h + 1, 2, out_w + 1, 2, channels)


_TAPS = [(i, j) for i in range(3) for j in range(3)]


def _pool_forward(x, geometry):
  _, padding = geometry  # static; the shape is for the backward pass
  phases = _pool_phases(x, padding)
  out_h, out_w = phases.shape[1] - 1, phases.shape[3] - 1
  y = winner = None
  for t, (i, j) in enumerate(_TAPS):
    tap = phases[:, i // 2:i // 2 + out_h, i % 2, j // 2:j // 2 + out_w, j % 2]
    if y is None:
      y, winner = tap, jnp.zeros(tap.shape, jnp.int8)
    else:  # strictly greater: the first tap holding the maximum wins, as in reduce_window
      better = tap > y
      y, winner = jnp.where(better, tap, y), jnp.where(better, jnp.int8(t), winner)
  return y, winner


def _pool_backward(geometry, winner, g):
  (batch, height, width, channels), padding = geometry
  top, left = _pool_pads(height, width, padding)
  by_phase = {}
  for t, (i, j) in enumerate(_TAPS):  # each tap's share lands on one parity phase, shifted
    share = jnp.pad(jnp.where(winner == t, g, 0), ((0, 0), (i // 2, 1 - i // 2),
                                                    (j // 2, 1 - j // 2), (0, 0)))
    key = (i % 2, j % 2)
    by_phase[key] = share if key not in by_phase else by_phase[key] + share
  rows = [jnp.stack([by_phase[(pi, pj)] for pj in (0, 1)], 3) for pi in (0, 1)]
  dx = jnp.stack(rows, 2)  # [B, Ho + 1, 2, Wo + 1, 2, C]
  dx = dx.reshape(batch, dx.shape[1] * 2, dx.shape[3] * 2, channels)
  return (dx[:, top:top + height, left:left + width],)


def max_pool_3x3_s2(x, padding='same'):
  """nnx.max_pool(x, (3, 3), strides=(2, 2), padding=...), same values and gradient; padding
  'same' (XLA's SAME) or 'symmetric' (PyTorch's MaxPool2d(3, 2, padding=1)).

  reduce_window's gradient is a select-and-scatter, which XLA's CPU backend expands into a
  variadic reduce-window over four iota index arrays plus a scatter: about 12 % of a
  ResNet-18 step at 128x128 and 15-20 % of the demo's. Here the forward keeps the index of
  each window's winning tap (int8) and the backward routes the gradient with selects and
  plain pads on the stride's parity phases, which XLA fuses into two passes over the input:
  forward + backward 2.9x faster for [64, 64, 64, 64] and 3.4x for the demo's
  [128, 28, 48, 24]. GPUs and TPUs keep reduce_window, whose select-and-scatter they run
  natively.
  """
  return lax.platform_dependent(x, cpu=lambda x: _max_pool(x, (x.shape, padding)),
                                default=lambda x: _reduce_pool(x, padding))


def _reduce_pool(x, padding):
  pads = 'SAME' if padding == 'same' else ((1, 1), (1, 1))
  return nnx.max_pool(x, (3, 3), strides=(2, 2), padding=pads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max_pool(x, geometry):
  return _pool_forward(x, geometry)[0]


_max_pool.defvjp(_pool_forward, _pool_backward)


def check_args(pool, padding='same'):
  if pool not in ('avg', 'none'):
    raise ValueError(f"model.pool={pool!r}: expected 'avg' or 'none'")
  if padding not in PADDINGS:
    raise ValueError(f'model.padding={padding!r}: expected one of {PADDINGS}')


def _norm(channels, dtype, rngs, zero_init=False):
  # Zero-initialising the last norm of each residual branch makes every block start as the
  # identity, which trains faster and more stably (Goyal et al. 2017).
  scale_init = nnx.initializers.zeros if zero_init else nnx.initializers.ones
  return nnx.BatchNorm(channels, momentum=0.9, dtype=dtype, scale_init=scale_init,
                       rngs=rngs)


class Shortcut(nnx.Module):
  """The residual path: identity, or a 1x1 projection when the shape changes."""

  def __init__(self, cin, cout, stride, *, dtype, rngs, padding='same'):
    self.conv = self.norm = None
    if stride != 1 or cin != cout:
      self.conv = nnx.data(_conv(cin, cout, 1, stride, dtype, rngs, padding))
      self.norm = nnx.data(_norm(cout, dtype, rngs))

  def __call__(self, x, train):
    if self.conv is None:
      return x
    return self.norm(self.conv(x), use_running_average=not train)

  def pytorch_layers(self, prefix):
    if self.conv is None:
      return []
    return [(f'{prefix}.downsample.0', self.conv), (f'{prefix}.downsample.1', self.norm)]


class BasicBlock(nnx.Module):
  expansion = 1

  def __init__(self, cin, channels, stride, *, dtype, rngs, padding='same'):
    cout = channels * self.expansion
    self.conv1 = _conv(cin, channels, 3, stride, dtype, rngs, padding)
    self.norm1 = _norm(channels, dtype, rngs)
    self.conv2 = _conv(channels, cout, 3, 1, dtype, rngs, padding)
    self.norm2 = _norm(cout, dtype, rngs, zero_init=True)
    self.shortcut = Shortcut(cin, cout, stride, dtype=dtype, rngs=rngs, padding=padding)

  def __call__(self, x, train):
    y = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
    y = self.norm2(self.conv2(y), use_running_average=not train)
    return nnx.relu(self.shortcut(x, train) + y)

  def pytorch_layers(self, prefix):
    return [(f'{prefix}.conv1', self.conv1), (f'{prefix}.bn1', self.norm1),
            (f'{prefix}.conv2', self.conv2), (f'{prefix}.bn2', self.norm2),
            *self.shortcut.pytorch_layers(prefix)]


class Bottleneck(nnx.Module):
  expansion = 4

  def __init__(self, cin, channels, stride, *, dtype, rngs, padding='same'):
    cout = channels * self.expansion
    self.conv1 = _conv(cin, channels, 1, 1, dtype, rngs, padding)
    self.norm1 = _norm(channels, dtype, rngs)
    self.conv2 = _conv(channels, channels, 3, stride, dtype, rngs, padding)
    self.norm2 = _norm(channels, dtype, rngs)
    self.conv3 = _conv(channels, cout, 1, 1, dtype, rngs, padding)
    self.norm3 = _norm(cout, dtype, rngs, zero_init=True)
    self.shortcut = Shortcut(cin, cout, stride, dtype=dtype, rngs=rngs, padding=padding)

  def __call__(self, x, train):
    y = nnx.relu(self.norm1(self.conv1(x), use_running_average=not train))
    y = nnx.relu(self.norm2(self.conv2(y), use_running_average=not train))
    y = self.norm3(self.conv3(y), use_running_average=not train)
    return nnx.relu(self.shortcut(x, train) + y)

  def pytorch_layers(self, prefix):
    return [(f'{prefix}.conv1', self.conv1), (f'{prefix}.bn1', self.norm1),
            (f'{prefix}.conv2', self.conv2), (f'{prefix}.bn2', self.norm2),
            (f'{prefix}.conv3', self.conv3), (f'{prefix}.bn3', self.norm3),
            *self.shortcut.pytorch_layers(prefix)]


class Model(nnx.Module):
  """ResNet trunk; `features` is the pooled feature size."""

  def __init__(self, *, depth=18, width=64, in_channels=1, stem='small',
               pool='avg', padding='same', dtype='float32', rngs):
    if depth not in LAYOUTS:
      raise ValueError(f'model.depth={depth}: expected one of {sorted(LAYOUTS)}')
    if stem not in ('small', 'imagenet'):
      raise ValueError(f"model.stem={stem!r}: expected 'small' or 'imagenet'")
    check_args(pool=pool, padding=padding)
    dtype = jnp.dtype(dtype)
    kind, counts = LAYOUTS[depth]
    block = BasicBlock if kind == 'basic' else Bottleneck
    self.stem_kind, self.pool, self.padding = stem, pool, padding
    self.depth = depth
    kernel, stride = (3, 1) if stem == 'small' else (7, 2)
    self.stem_conv = _conv(in_channels, width, kernel, stride, dtype, rngs, padding)
    self.stem_norm = _norm(width, dtype, rngs)
    blocks, cin = [], width
    for stage, count in enumerate(counts):
      channels = width * 2**stage
      for i in range(count):
        stride = 2 if (i == 0 and (stage > 0 or stem == 'small')) else 1
        blocks.append(block(cin, channels, stride, dtype=dtype, rngs=rngs, padding=padding))
        cin = channels * block.expansion
    self.blocks = nnx.List(blocks)
    self.features = cin

  def __call__(self, x, train=False):
    x = nnx.relu(self.stem_norm(self.stem_conv(x), use_running_average=not train))
    if self.stem_kind == 'imagenet':
      x = max_pool_3x3_s2(x, self.padding)
    for block in self.blocks:
      x = block(x, train)
    if self.pool == 'none':  # feature map for pooling heads such as GeM / NetVLAD
      return x
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))

  def pytorch_namings(self):
    """{naming: ((PyTorch name prefix, layer) in forward order, classifier prefix)} for
    pytorch_weights.py; torchvision's and timm's resnets name their layers alike."""
    return {'torchvision/timm': (resnet_layers(self, LAYOUTS[self.depth][1]), 'fc.')}


def resnet_layers(model, counts):
  """torchvision's names for a ResNet-layout trunk (stem_conv, stem_norm, blocks)."""
  layers = [('conv1', model.stem_conv), ('bn1', model.stem_norm)]
  names = [f'layer{stage + 1}.{i}' for stage, count in enumerate(counts) for i in range(count)]
  for name, block in zip(names, model.blocks, strict=True):
    layers += block.pytorch_layers(name)
  return layers
