"""Training-step throughput: the trainer's jitted step against PyTorch on the same CPU.

  python -m bench.train_step            # full
  python -m bench.train_step --quick    # fewer steps, no augmentation row
  (or through python -m bench.run, which writes the table in docs/benchmarks.md)

JAX side: the real trainer step, `train.init_state` + `train.make_train_step` with the
grapheme task's loss (weighted cross-entropy of the three component heads + the whole-grapheme
head), global-norm clipping and AdamW with its schedule, state donated, on every local device.
PyTorch side (bench/torch_models.py): the same network layer for layer (asserted: equal
parameter tensor sizes), the same loss, clipping and AdamW (fused, no decay on vectors) with
the same schedule; eager, NCHW (faster here than channels_last). torch (and timm, whose
efficientnet_b0 is the EfficientNet case's PyTorch side) come from requirements-torch.txt,
never requirements.txt.

Fairness: both sides take the same uint8 batch at the model's input size and invert/scale it
inside the step; nothing else happens to the images on either side. The trainer's on-device
augmentation (affine warp, GridMask, CutMix) and crop-to-ink are switched off for the
comparison, since a PyTorch pipeline runs its augmentation in DataLoader workers, outside the
step. A last row (full runs only) shows the JAX step with them on (the demo config exactly as
trained, from raw 137x236 images) against the bare JAX step.

Cases: (a) the grapheme demo model (configs/grapheme.py:demo: ResNet-10, width 24, imagenet
stem, 56x96, batch 128); (b) a ResNet-18 (width 64, imagenet stem, one input channel, the same
heads) at 128x128, batch 64; (c) EfficientNet-B0 (bengrapheme/models/efficientnet.py against
timm's efficientnet_b0, one input channel, no dropout, the same heads) at 128x128, batch 64:
the cost of the winners' architecture beside the ResNet's. The consonant diacritic is the
plain 7-way head on both sides (the demo's 4 part heads have no PyTorch twin). After the
EfficientNet case, its 16 depthwise layers alone (forward and both gradients, as the model runs
them on CPU: bengrapheme/models/depthwise.py) against the code before them
(bench/reference_depthwise.py), in one process, results asserted equal. Threads:
torch.set_num_threads(cores available), with OMP_WAIT_POLICY=PASSIVE (see TORCH_ENV); XLA's
CPU client runs one thread per available core.

Each side lives in a worker process of its own (bench.common.Worker: set up and compiled once,
then one timed repeat of a few steps per request), the two taking turns; each row holds the
ratio of every turn and their median. The jit compile time is `jitted.lower(state,
batch).compile()` (trace + lower + XLA compile), compiled afresh common.MIN_REPEATS times.
"""
import argparse
import os
import sys
import time

import numpy as np

from bench import common

CASES = {
    # name: (model name and args, None for the demo's own; input size; batch)
    'grapheme_demo': (None, (56, 96), 128),
    'resnet18_128': (('resnet', dict(depth=18, width=64, stem='imagenet', dtype='float32')),
                     (128, 128), 64),
    'efficientnet_b0_128': (('efficientnet', dict(variant='b0', dtype='float32')),
                            (128, 128), 64),
}
# (steps per timed repeat, repeats) of a full run; many short repeats beat few long ones on a
# shared machine: a burst of load from others then spoils one turn, not the median.
FULL = {'grapheme_demo': (2, 8), 'resnet18_128': (1, 6), 'efficientnet_b0_128': (1, 6)}
# The jit compile of the train step should take at most this long (seconds), whatever the case.
COMPILE_TARGET_S = 10
RAW_SIZE = (137, 236)  # the Kaggle image the as-trained demo step crops and augments on device
# libgomp's default spin-waiting made torch 6x slower on a shared 2-core machine (52 vs 302
# images/s for the demo model, same run); passive waiting is the fair reference there.
TORCH_ENV = dict(OMP_WAIT_POLICY='PASSIVE')


def cores():
  return len(os.sched_getaffinity(0))


def make_config(case, augment=False):
  """configs/grapheme.py:demo resized to the case, augmentation and crop-to-ink off; with
  `augment`, the demo model with crop-to-ink and the kaggle config's augmentation on device
  (the demo trains without augmentation)."""
  sys.path.insert(0, common.ROOT)
  from configs import grapheme
  c = grapheme.get_config('demo')
  if augment:
    c.aug.update({k: grapheme.get_config('kaggle').aug[k]
                  for k in ('affine', 'grid_mask_prob', 'mixup_alpha', 'mix_prob')})
    return c
  model, size, batch = CASES[case]
  if model is not None:
    c.model.name, c.model.args = model
  # The PyTorch twin has the plain 7-way consonant head (cross-entropy), not the 4 part heads,
  # and the whole-grapheme head but no root-letter head, whichever the demo trains with.
  c.model.consonant_parts = False
  c.model.grapheme_head, c.model.root_letters = True, False
  c.input.size, c.train.batch_size = size, batch
  c.input.crop_to_ink = False
  c.aug.update(affine=False, cutout_prob=0.0, grid_mask_prob=0.0, mix_prob=0.0)
  return c


def synthetic_batch(config, size, seed=0):
  rng = np.random.default_rng(seed)
  b = config.train.batch_size
  labels = np.stack([rng.integers(0, n, b) for n in (168, 11, 7)], 1).astype(np.int32)
  return dict(image=rng.integers(0, 256, (b, *size), dtype=np.uint8), labels=labels,
              grapheme=rng.integers(0, 1295, b).astype(np.int32))


# ---------------------------------------------------------------- workers (one per process)


def jax_setup(case, augment, steps, compiles=1):
  import jax
  from bengrapheme.grapheme import task
  config = make_config(case, augment)
  size = RAW_SIZE if augment else tuple(config.input.size)
  state, jitted, batch = common.trainer_step(config, task, synthetic_batch(config, size))
  # Compiled afresh each time, with no cache in memory or on disk to hand back the last
  # executable, so that the compile time has a spread like every other timed figure.
  jax.config.update('jax_enable_compilation_cache', False)
  compile_s, load = [], [common.quiet_load_average()]
  for _ in range(compiles):
    jax.clear_caches()
    start = time.perf_counter()
    step = jitted.lower(state, batch).compile()
    compile_s.append(time.perf_counter() - start)
  load.append(common.load_average())
  holder = [state]

  def run_once():
    s = holder[0]
    for _ in range(steps):
      s, _ = step(s, batch)
    jax.block_until_ready(s)
    holder[0] = s

  run_once()  # warm-up: first-touch allocations
  params = sum(p.size for p in jax.tree.leaves(holder[0]['params']))
  return run_once, dict(compile_s=compile_s, compile_load=load, batch=config.train.batch_size,
                        params=int(params))


def torch_setup(case, steps):
  import torch
  from flax import nnx
  from bench import torch_models
  from bengrapheme.grapheme import task
  torch.set_num_threads(cores())
  torch.manual_seed(0)
  config = make_config(case)
  model, step = torch_models.make_step(config)
  # The JAX model's parameter shapes, from an abstract init (no compute, no memory).
  jax_model = nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0)))
  params = torch_models.check_same_parameters(model, nnx.state(jax_model, nnx.Param))
  b = synthetic_batch(config, tuple(config.input.size))
  images = torch.from_numpy(b['image'])
  labels, grapheme = torch.from_numpy(b['labels']).long(), torch.from_numpy(b['grapheme']).long()

  def run_once():
    for _ in range(steps):
      step(images, labels, grapheme)

  run_once()
  return run_once, dict(batch=config.train.batch_size, params=params,
                        version=torch.__version__.split('+')[0])


# ---------------------------------------------------------------- the depthwise layers alone


def depthwise_layers(size, batch):
  """EfficientNet-B0's depthwise convolutions at size x size input: ([B, H, W, C] of the
  input, kernel, stride), after the stride-2 stem."""
  from bengrapheme.models import efficientnet
  h, cin, layers = size // 2, efficientnet.STEM, []
  for repeats, kernel, stride, expansion, cout in efficientnet.STAGES:
    for r in range(repeats):
      s = stride if r == 0 else 1
      layers.append(((batch, h, h, cin * expansion), kernel, s))
      h, cin = -(-h // s), cout
  return layers


def depthwise_row(quick):
  """Forward + both gradients of all of B0's depthwise layers, as the model computes them on
  CPU (bengrapheme/models/depthwise.py) and as it did before (bench/reference_depthwise.py),
  each jitted with the train step's compiler options, timed in turns in this process."""
  import jax
  from bengrapheme import parallel
  from bengrapheme.models import depthwise, resnet
  from bench import reference_depthwise
  size, batch = CASES['efficientnet_b0_128'][1][0], 8 if quick else 64
  layers, rng = depthwise_layers(size, batch), np.random.default_rng(0)
  data = [[rng.standard_normal(shape, np.float32) for shape in
           (x_shape, (k, k, 1, x_shape[-1]), (batch, -(-x_shape[1] // s), -(-x_shape[2] // s),
                                               x_shape[-1]))]
          for x_shape, k, s in layers]

  def compiled(conv):
    def forward_backward(data):
      results = []
      for (x, w, dy), (_, k, s) in zip(data, layers):
        padding = resnet.conv_padding(k, s, 'symmetric')  # as the model pads
        y, vjp = jax.vjp(lambda x, w: conv(x, w, (s, s), padding), x, w)
        results.append((y, *vjp(dy)))
      return results
    start = time.perf_counter()
    step = jax.jit(forward_backward).lower(data).compile(parallel.compiler_options())
    return step, time.perf_counter() - start

  steps = {'new': compiled(depthwise.conv), 'reference': compiled(reference_depthwise.conv)}
  results = {name: step(data) for name, (step, _) in steps.items()}
  for new, reference in zip(jax.tree.leaves(results['new']),
                            jax.tree.leaves(results['reference'])):
    np.testing.assert_allclose(new, reference, rtol=1e-4,
                               atol=1e-4 * float(np.abs(reference).max()))
  del results
  turns = common.interleaved(
      {name: lambda step=step: jax.block_until_ready(step(data))
       for name, (step, _) in steps.items()}, common.MIN_REPEATS if quick else 6)
  row = common.timed_record(
      'depthwise convolutions, efficientnet_b0_128 (forward + backward)', 'ms',
      'the shifted slices before (bench/reference_depthwise.py)', turns,
      lambda t: (t['new'] * 1e3, t['reference'] * 1e3, t['reference'] / t['new']),
      note=f'the {len(layers)} depthwise layers at {size}x{size}, batch {batch}, f32: output '
           'and both gradients equal (asserted); compile '
           f'{steps["new"][1]:.1f} s, reference {steps["reference"][1]:.1f} s')
  _log(f'depthwise layers: {row["value"]:.0f} ms, reference {row["reference_value"]:.0f} ms')
  return row


# ---------------------------------------------------------------- driver


def _log(*args):
  print('  train_step:', *args, file=sys.stderr, flush=True)


def run(quick: bool, cases=tuple(CASES)) -> list[dict]:
  rows, demo_batch = [], None
  for case in cases:
    steps, repeats = (1, common.MIN_REPEATS) if quick else FULL[case]
    _log(f'{case}: compiling / setting up both sides')
    workers = {'jax': common.Worker('bench.train_step',
                                    ['jax', case, str(steps), f'compiles={common.MIN_REPEATS}']),
               'torch': common.Worker('bench.train_step', ['torch', case, str(steps)],
                                      env=TORCH_ENV)}
    info = {name: w.setup for name, w in workers.items()}
    assert info['jax']['params'] == info['torch']['params'], info  # same network both sides
    turns = common.time_workers(workers, repeats)
    batch = info['jax']['batch']
    ips = lambda seconds: batch * steps / seconds
    row = common.timed_record(
        f'train step, {case} (JAX vs PyTorch)', 'images/s',
        f'PyTorch {info["torch"]["version"]} CPU, eager, same model, loss, AdamW', turns,
        lambda t: (ips(t['jax']), ips(t['torch']), t['torch'] / t['jax']),
        target='>= 1.0x', meets=lambda value, ratio: ratio >= 1.0,
        note=f'{info["jax"]["params"]:,} params, batch {batch}, {steps} steps a repeat, '
             f'f32, {cores()} threads; augmentation off on both sides')
    rows.append(row)
    _log(f'{case}: jax {row["value"]:.1f} images/s, torch {row["reference_value"]:.1f} '
         f'images/s, ratios {row["min"]:.2f}-{row["max"]:.2f}x')
    step_s = np.median([t['jax'] for t in turns.each]) / steps
    compiles = common.Turns({}, [dict(jax=s) for s in info['jax']['compile_s']],
                            tuple(info['jax']['compile_load']))
    row = common.timed_record(
        f'jit compile, {case}', 's', None, compiles, lambda t: (t['jax'], None, None),
        target=f'<= {COMPILE_TARGET_S} s', meets=lambda value, ratio: value <= COMPILE_TARGET_S,
        note='lower + compile of the train step, compiled afresh each repeat')
    row['note'] += f' = {row["value"] / step_s:.0f} steady steps'
    rows.append(row)
    if case == 'grapheme_demo':
      demo_batch = batch
    if case == 'efficientnet_b0_128':
      _log('efficientnet_b0_128: its depthwise layers alone, against the code before')
      rows.append(depthwise_row(quick))
  if not quick and 'grapheme_demo' in cases:
    steps, repeats = FULL['grapheme_demo']
    _log('grapheme_demo as trained: crop-to-ink and augmentation on device')
    workers = {'aug': common.Worker('bench.train_step', ['jax', 'grapheme_demo', str(steps),
                                                         'augment']),
               'bare': common.Worker('bench.train_step', ['jax', 'grapheme_demo', str(steps)])}
    turns = common.time_workers(workers, repeats)
    ips = lambda seconds: demo_batch * steps / seconds
    rows.append(common.timed_record(
        'train step, grapheme_demo with crop-to-ink + augmentation', 'images/s',
        'same JAX step without them', turns,
        lambda t: (ips(t['aug']), ips(t['bare']), t['bare'] / t['aug']),
        note='raw 137x236 uint8 in; the demo model with the kaggle config\'s affine, GridMask '
             'and MixUp/CutMix'))
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--quick', action='store_true')
  p.add_argument('--cases', nargs='+', choices=list(CASES), default=list(CASES),
                 help='measure only these cases (python -m bench.run measures them all)')
  p.add_argument('--worker', nargs='+', help=argparse.SUPPRESS)
  a = p.parse_args()
  if a.worker:
    side, case, steps, *rest = a.worker
    if side == 'jax':
      compiles = next((int(r.split('=')[1]) for r in rest if r.startswith('compiles=')), 1)
      common.serve(lambda: jax_setup(case, 'augment' in rest, int(steps), compiles))
    else:
      common.serve(lambda: torch_setup(case, int(steps)))
    return
  for row in run(a.quick, a.cases):
    print(row)


if __name__ == '__main__':
  main()
