"""Training images/s and model FLOPs utilisation of both tasks' full configs on an accelerator.

  bash bench/gpu.sh                                  # installs the CUDA jax build, runs this
  python -m bench.gpu_throughput --out R.json        # with a jax that already sees the GPU
  python -m bench.gpu_throughput --cpu-smoke         # tiny configs on CPU: checks the script

Measures the trainer's real jitted step (`train.init_state` + `train.make_train_step`, state
donated) for configs/grapheme.py:kaggle (EfficientNet-B3, 137x236, batch 256, crop-to-ink
and augmentation on device, EMA) and configs/fragments.py:hisfrag20 (ResNet-34 on 64 px
patches, P x K batches, multi-similarity loss, EMA), both with bf16 compute as configured,
from random weights (the step costs the same from model.init_from's). Batches are synthetic
random uint8 arrays put on the devices once, so the figure is the step alone, not the input
pipeline.

MFU = FLOPs per step per device (XLA's cost analysis of the compiled step) / step time /
the device's dense bf16 peak (PEAK_BF16 below, by device_kind). The cost analysis of the
unoptimised program (`lowered.cost_analysis()`) is recorded beside it; it is used instead
when the compiled figure is missing (a backend that counts library calls as 0 FLOPs).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Dense bf16 FLOP/s per device, by a substring of jax's device_kind, first match wins.
PEAK_BF16 = (
    ('H100 PCIe', 756e12),
    ('H100', 989e12), ('H200', 989e12), ('H800', 989e12),  # SXM; 'GH200' matches H200
    ('A100', 312e12), ('A800', 312e12),
    ('L40S', 362e12), ('L4', 121e12),
    ('TPU v6', 918e12), ('TPU v5p', 459e12), ('TPU v5', 197e12), ('TPU v4', 275e12),
)
TASKS = (('grapheme', 'kaggle'), ('fragments', 'hisfrag20'))


def peak_flops(device_kind):
  for key, flops in PEAK_BF16:
    if key.lower() in device_kind.lower():
      return flops
  return None


def get_config(module, variant, smoke):
  import importlib
  c = importlib.import_module(f'configs.{module}').get_config('test' if smoke else variant)
  c.model.init_from = ''  # no weight file needed to time a step
  if smoke:  # the tests' tiny sizes, with the full configs' bf16 compute
    c.model.args.dtype = 'bfloat16'
  return c


def synthetic_batch(module, config, seed=0):
  rng = np.random.default_rng(seed)
  b = config.train.batch_size
  if module == 'grapheme':
    return dict(image=rng.integers(0, 256, (b, 137, 236), dtype=np.uint8),
                labels=np.stack([rng.integers(0, n, b) for n in (168, 11, 7)], 1).astype(
                    np.int32),
                grapheme=rng.integers(0, 1295, b).astype(np.int32))
  size = config.input.patch_size
  label = np.repeat(np.arange(config.train.writers_per_batch),
                    b // config.train.writers_per_batch).astype(np.int32)
  return dict(image=rng.integers(0, 2, (b, size, size, 1), dtype=np.uint8) * 255, label=label)


def _flops(cost):
  if isinstance(cost, (list, tuple)):  # older jax: one dict per program
    cost = cost[0] if cost else {}
  value = (cost or {}).get('flops')
  return float(value) if value and value > 0 else None


def measure(module, variant, steps, repeats, smoke):
  import jax
  from bench import common
  from bengrapheme import train
  config = get_config(module, variant, smoke)
  state, jitted, batch = common.trainer_step(config, train.load_task(config),
                                             synthetic_batch(module, config))
  start = time.perf_counter()
  lowered = jitted.lower(state, batch)
  step = lowered.compile()
  compile_s = time.perf_counter() - start
  compiled_flops = _flops(step.cost_analysis())
  lowered_flops = _flops(lowered.cost_analysis())  # the whole program, before partitioning
  n = jax.device_count()
  if compiled_flops:
    flops, source = compiled_flops, 'compiled'
  else:
    flops, source = (lowered_flops / n if lowered_flops else None), 'lowered / devices'

  state, scalars = step(state, batch)  # warm-up
  jax.block_until_ready(state)
  best = float('inf')
  for _ in range(repeats):
    t = time.perf_counter()
    for _ in range(steps):
      state, scalars = step(state, batch)
    jax.block_until_ready(state)
    best = min(best, (time.perf_counter() - t) / steps)
  loss = float(jax.device_get(scalars['loss']))
  if not np.isfinite(loss):
    raise FloatingPointError(f'{module}:{variant}: loss {loss} on synthetic data')
  kind = jax.devices()[0].device_kind
  peak = peak_flops(kind)
  achieved = flops / best if flops else None
  return dict(
      task=f'{module}:{"test (smoke)" if smoke else variant}',
      model=' '.join([config.model.name] + [f'{k}={v}' for k, v in config.model.args.items()
                                             if k != 'dtype']),
      dtype=config.model.args.dtype, global_batch=config.train.batch_size, devices=n,
      device_kind=kind, compile_s=round(compile_s, 2), step_ms=round(best * 1e3, 3),
      images_per_s=round(config.train.batch_size / best, 1),
      images_per_s_per_device=round(config.train.batch_size / best / n, 1),
      flops_per_step_per_device=flops, flops_source=source,
      flops_compiled=compiled_flops, flops_lowered=lowered_flops,
      achieved_tflops_per_device=float(f'{achieved / 1e12:.4g}') if achieved else None,
      peak_bf16_tflops=peak / 1e12 if peak else None,
      mfu=round(achieved / peak, 4) if achieved and peak else None,
      steps=steps, repeats=repeats, final_loss=loss)


def table(rows):
  head = ('task', 'model', 'batch', 'compile s', 'step ms', 'images/s', 'TFLOP/s/dev', 'MFU')
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    mfu = f'{100 * r["mfu"]:.1f} %' if r['mfu'] is not None else 'n/a (no peak for device)'
    lines.append('| ' + ' | '.join(str(v) for v in (
        r['task'], f'{r["model"]} {r["dtype"]}', r['global_batch'], r['compile_s'],
        r['step_ms'], r['images_per_s'], r['achieved_tflops_per_device'], mfu)) + ' |')
  return '\n'.join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--cpu-smoke', action='store_true',
                 help="the configs' tiny 'test' variants in bf16 on CPU: checks the script")
  p.add_argument('--steps', type=int, default=None, help='steps per timed repeat')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--tasks', nargs='+', default=[m for m, _ in TASKS],
                 choices=[m for m, _ in TASKS])
  p.add_argument('--out', default=os.path.join(ROOT, 'bench', 'gpu_throughput.json'))
  a = p.parse_args()
  if a.cpu_smoke:
    os.environ['JAX_PLATFORMS'] = 'cpu'
  import jax
  if not a.cpu_smoke and jax.default_backend() == 'cpu':
    sys.exit('jax sees no accelerator (backend cpu): install the CUDA build (bench/gpu.sh) or '
             'pass --cpu-smoke')
  steps = a.steps or (2 if a.cpu_smoke else 30)
  rows = []
  for module, variant in TASKS:
    if module in a.tasks:
      print(f'{module}:{variant}: compiling and timing ...', file=sys.stderr, flush=True)
      rows.append(measure(module, variant, steps, 1 if a.cpu_smoke else a.repeats,
                          a.cpu_smoke))
      print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  print(table(rows))
  result = dict(jax=jax.__version__, backend=jax.default_backend(),
                date=time.strftime('%Y-%m-%d %H:%M:%S'), results=rows)
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  with open(a.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(f'wrote {a.out}', file=sys.stderr)


if __name__ == '__main__':
  main()
