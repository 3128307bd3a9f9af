"""PyTorch twins of the grapheme model and its training step, the reference for bench/train_step.

The architecture mirrors bengrapheme/models/resnet.py and bengrapheme/grapheme/task.py layer
for layer: the same block types, widths, strides, stems, bias-free convolutions, BatchNorm
(momentum 0.9 in Flax = 0.1 in PyTorch, eps 1e-5), zero-initialised last norm of each residual
branch, global average pooling and the linear heads (3 components + the 1,295-way grapheme
head). `check_same_parameters` asserts that both sides hold the same number of parameters in
tensors of the same sizes, so a drift in either file fails the benchmark instead of silently
comparing different networks.

Padding differs in form only: Flax 'SAME' pads (0, 1) for a stride-2 3x3 convolution on an even
input where PyTorch pads (1, 1); output shapes and FLOPs are identical.

The step is the trainer's: weighted soft-max cross-entropy (root 2 : vowel 1 : consonant 1,
plus loss.terms.grapheme x the whole-grapheme head), global-norm clipping, then AdamW with a
linear warm-up + cosine schedule and no weight decay on vectors (norm scales, biases).
"""
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bengrapheme.grapheme.kaggle import NUM_CLASSES
from bengrapheme.models.resnet import LAYOUTS
NUM_GRAPHEMES = 1295  # bengrapheme.grapheme.classes.NUM_GRAPHEMES
COMPONENT_WEIGHTS = (2.0, 1.0, 1.0)  # bengrapheme.grapheme.metrics.COMPONENT_WEIGHTS


def _conv(cin, cout, kernel, stride):
  return nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False)


def _norm(channels, zero_init=False):
  norm = nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)
  if zero_init:
    nn.init.zeros_(norm.weight)
  return norm


class Shortcut(nn.Module):

  def __init__(self, cin, cout, stride):
    super().__init__()
    self.project = stride != 1 or cin != cout
    if self.project:
      self.conv, self.norm = _conv(cin, cout, 1, stride), _norm(cout)

  def forward(self, x):
    return self.norm(self.conv(x)) if self.project else x


class BasicBlock(nn.Module):
  expansion = 1

  def __init__(self, cin, channels, stride):
    super().__init__()
    self.conv1, self.norm1 = _conv(cin, channels, 3, stride), _norm(channels)
    self.conv2, self.norm2 = _conv(channels, channels, 3, 1), _norm(channels, zero_init=True)
    self.shortcut = Shortcut(cin, channels, stride)

  def forward(self, x):
    y = F.relu(self.norm1(self.conv1(x)))
    y = self.norm2(self.conv2(y))
    return F.relu(self.shortcut(x) + y)


class Bottleneck(nn.Module):
  expansion = 4

  def __init__(self, cin, channels, stride):
    super().__init__()
    cout = channels * 4
    self.conv1, self.norm1 = _conv(cin, channels, 1, 1), _norm(channels)
    self.conv2, self.norm2 = _conv(channels, channels, 3, stride), _norm(channels)
    self.conv3, self.norm3 = _conv(channels, cout, 1, 1), _norm(cout, zero_init=True)
    self.shortcut = Shortcut(cin, cout, stride)

  def forward(self, x):
    y = F.relu(self.norm1(self.conv1(x)))
    y = F.relu(self.norm2(self.conv2(y)))
    y = self.norm3(self.conv3(y))
    return F.relu(self.shortcut(x) + y)


class ResNet(nn.Module):
  """bengrapheme.models.resnet.Model: NCHW input -> pooled features [B, D]."""

  def __init__(self, depth=18, width=64, in_channels=1, stem='small', dtype='float32'):
    super().__init__()
    if dtype != 'float32':
      raise ValueError('the CPU reference runs float32 only')
    kind, counts = LAYOUTS[depth]
    block = BasicBlock if kind == 'basic' else Bottleneck
    kernel, stride = (3, 1) if stem == 'small' else (7, 2)
    self.stem = nn.Sequential(_conv(in_channels, width, kernel, stride), _norm(width),
                              nn.ReLU(inplace=True))
    if stem == 'imagenet':
      self.stem.append(nn.MaxPool2d(3, 2, padding=1))
    blocks, cin = [], width
    for stage, count in enumerate(counts):
      channels = width * 2**stage
      for i in range(count):
        s = 2 if (i == 0 and (stage > 0 or stem == 'small')) else 1
        blocks.append(block(cin, channels, s))
        cin = channels * block.expansion
    self.blocks = nn.Sequential(*blocks)
    self.features = cin

  def forward(self, x):
    return self.blocks(self.stem(x)).mean((2, 3))


def efficientnet(variant, dtype='float32'):
  """timm's efficientnet_bN trunk: bengrapheme/models/efficientnet.py's reference (its tests
  check the two compute the same features), without the classifier's dropout, which the JAX
  model does not have."""
  import timm
  if dtype != 'float32':
    raise ValueError('the CPU reference runs float32 only')
  model = timm.create_model(f'efficientnet_{variant}', in_chans=1, num_classes=0, drop_rate=0.0)
  model.features = model.num_features
  return model


class GraphemeNet(nn.Module):
  """bengrapheme.grapheme.model.GraphemeModel: backbone + component heads + grapheme head."""

  def __init__(self, model_args, grapheme_head=True, name='resnet'):
    super().__init__()
    if name == 'efficientnet':
      self.backbone = efficientnet(**model_args)
    else:
      self.backbone = ResNet(in_channels=1, **model_args)
    d = self.backbone.features
    self.heads = nn.ModuleList([nn.Linear(d, n) for n in NUM_CLASSES])
    self.grapheme_head = nn.Linear(d, NUM_GRAPHEMES) if grapheme_head else None

  def forward(self, x):
    features = self.backbone(x)
    logits = [head(features) for head in self.heads]
    if self.grapheme_head is not None:
      logits.append(self.grapheme_head(features))
    return logits


def parameter_sizes(module):
  return sorted(p.numel() for p in module.parameters())


def check_same_parameters(torch_model, jax_params):
  """Asserts equal parameter counts and equal multisets of tensor sizes (layout-free)."""
  import jax
  jax_sizes = sorted(int(np.prod(x.shape)) for x in jax.tree.leaves(jax_params))
  torch_sizes = parameter_sizes(torch_model)
  assert sum(torch_sizes) == sum(jax_sizes), (
      f'parameter counts differ: torch {sum(torch_sizes):,} vs jax {sum(jax_sizes):,}')
  assert torch_sizes == jax_sizes, 'same count but different tensor sizes'
  return sum(jax_sizes)


def make_step(config, memory_format=torch.contiguous_format):
  """(model, step(images_uint8 [B, H, W], labels [B, 3], grapheme [B]) -> loss) like the trainer's.

  Images enter as uint8 and are inverted and scaled to [0, 1] inside the step, as the JAX
  task's `preprocess` does. NCHW: on this CPU it beat channels_last for both cases
  (1.5 vs 2.8 s per step for the demo model, 9.7 vs 10.3 s for ResNet-18, same process).
  """
  model = GraphemeNet(dict(config.model.args), config.model.grapheme_head, config.model.name)
  model = model.to(memory_format=memory_format).train()
  t = config.train
  decay = [p for p in model.parameters() if p.ndim > 1]
  no_decay = [p for p in model.parameters() if p.ndim <= 1]
  opt = torch.optim.AdamW([dict(params=decay, weight_decay=t.weight_decay),
                           dict(params=no_decay, weight_decay=0.0)], lr=t.lr, fused=True)
  total = max(t.steps, t.warmup_steps + 1)

  def schedule(step):  # optax.warmup_cosine_decay_schedule, as a multiplier of t.lr
    if step < t.warmup_steps:
      return step / t.warmup_steps
    progress = min((step - t.warmup_steps) / (total - t.warmup_steps), 1.0)
    final = t.final_lr_fraction
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))

  scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
  weights = COMPONENT_WEIGHTS

  def step(images, labels, grapheme):
    x = (255.0 - images.float()) / 255.0
    x = x.unsqueeze(1).contiguous(memory_format=memory_format)
    logits = model(x)
    ce = [F.cross_entropy(logits[i], labels[:, i]) for i in range(3)]
    loss = sum(w * c for w, c in zip(weights, ce)) / sum(weights)
    if config.model.grapheme_head:
      loss = loss + config.loss.terms.grapheme * F.cross_entropy(logits[3], grapheme)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
    opt.step()
    scheduler.step()
    return loss

  return model, step
