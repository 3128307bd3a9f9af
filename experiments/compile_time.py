"""Where the EfficientNet-B0 train step's compile time goes (bench/train_step.py's case, whose
target is 10 s): trace + lower, then XLA's compile, of the trainer's step as it
is and of two variants that each take one part away, each in a process of its own.

  python -m experiments.compile_time --record compile-time

  step        train.make_train_step as bench/train_step.py compiles it
  sgd         the same with plain SGD in place of global-norm clipping + AdamW: what the
              optimizer's per-parameter kernels cost
  native_dw   the same with XLA's grouped convolution in place of bengrapheme/models/
              depthwise.py on CPU (slow to run, bench/train_step.py): what its loops cost
  bare        both at once: what the network's own forward and backward pass cost, a floor
              that no change to the optimizer or the depthwise loops goes below
  cached      the trainer's step in a second process, the first having filled a fresh
              persistent compilation cache (bengrapheme/compile_cache.py, on in every launch
              command): what a restart, a resume or launch.evaluate of the same config pays
"""
import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time

from bench import common
from experiments import records

VARIANTS = ('step', 'sgd', 'native_dw', 'bare', 'cached')


def measure(variant, cache):
  import optax
  from jax import lax
  from bench import train_step
  from bengrapheme import compile_cache, train
  from bengrapheme.grapheme import task
  from bengrapheme.models import depthwise
  compile_cache.enable(cache)
  if variant in ('sgd', 'bare'):
    schedule_of = train.optimizer
    train.optimizer = lambda config: (optax.sgd(schedule_of(config)[1]), schedule_of(config)[1])
  if variant in ('native_dw', 'bare'):
    depthwise.conv = lambda x, w, strides, padding: lax.conv_general_dilated(
        x, w, strides, padding, dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
        feature_group_count=x.shape[-1])
  config = train_step.make_config('efficientnet_b0_128')
  state, jitted, batch = common.trainer_step(config, task,
                                             train_step.synthetic_batch(config, (128, 128)))
  start, cpu_start = time.perf_counter(), cpu_seconds()
  lowered = jitted.lower(state, batch)
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  done = time.perf_counter()
  fusions = len(re.findall(r'^\s*%?\S*fusion\S* = ', compiled.as_text(), re.M))
  # CPU seconds over wall seconds: how many of the cores XLA already keeps busy, so how much
  # more threads could buy.
  return dict(lower_s=round(lowered_at - start, 2), compile_s=round(done - lowered_at, 2),
              total_s=round(done - start, 2), cpu_s=round(cpu_seconds() - cpu_start, 2),
              fusions=fusions)


def cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--record', default='')
  parser.add_argument('--variant', choices=VARIANTS, help=argparse.SUPPRESS)
  parser.add_argument('--cache', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.variant:  # a worker: one variant in a fresh process
    print(json.dumps(measure(args.variant, args.cache)))
    return
  commit = records.commit_of() if args.record else ''

  def worker(variant, cache=''):
    out = subprocess.run([sys.executable, '-m', 'experiments.compile_time', '--variant', variant,
                          '--cache', cache],
                         cwd=common.ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])

  scores = {}
  for variant in VARIANTS:
    if variant == 'cached':
      with tempfile.TemporaryDirectory() as cache:
        worker('step', cache)  # fills it
        scores[variant] = worker('step', cache)
    else:
      scores[variant] = worker(variant)
    print(variant, scores[variant], flush=True)
  if args.record:
    command = 'python -m experiments.compile_time --record ' + args.record
    print(records.add(args.record, None, [command], commit, 'one process a variant, no '
                      'compilation cache but in `cached`; 2 cores shared with no other job '
                      '(the fragment training beside it paused)', scores=scores))


if __name__ == '__main__':
  main()
