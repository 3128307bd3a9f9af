"""Sharding overhead: the trainer's step on 1, 2, 4, 8 simulated devices, one global batch.

  python -m bench.sharding [--quick]

Each device count runs in a process of its own (XLA_FLAGS=--xla_force_host_platform_device_
count=N must be set before jax starts) with the trainer's own `init_state` and
`make_train_step` on configs/grapheme.py:demo (ResNet-10 at 56x96, global batch 128, the
batch split over the `data` axis). The processes are started and compiled first, then take
turns timing a few steps each, so that load from elsewhere hits every count alike.

This checks that sharding adds little overhead on one host, not a speed-up: simulated devices
share the same cores. Ratio = 1-device step time / N-device step time. It came out above 1
here: the N devices' programs run concurrently and keep both cores busier than one device's
program does, which leaves parts of the step on one thread.
"""
import os
import sys
import time

import numpy as np

from bench import common

DEVICE_COUNTS = (1, 2, 4, 8)


def _worker(devices, steps):
  devices, steps = int(devices), int(steps)  # as the command line gives them

  def setup():
    import jax
    from bengrapheme import parallel, train
    from bengrapheme.grapheme.kaggle import NUM_CLASSES
    from configs import grapheme
    assert jax.device_count() == devices, jax.devices()
    config = grapheme.get_config('demo')
    task = train.load_task(config)
    mesh = parallel.make_mesh(config.mesh)
    graphdef, state = train.init_state(config, task, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    step = train.make_train_step(config, task, graphdef, mesh, shardings)
    n = config.train.batch_size
    rng = np.random.default_rng(0)
    batch = parallel.global_batch(mesh, dict(
        image=common.synthetic_images(n, seed=0),
        labels=np.stack([rng.integers(0, c, n) for c in NUM_CLASSES], 1).astype(np.int32),
        grapheme=rng.integers(-1, 1295, n).astype(np.int32),
        index=np.arange(n, dtype=np.int32)))
    holder = [state]

    def run_steps(k):
      for _ in range(k):
        holder[0], scalars = step(holder[0], batch)  # the state is donated: keep the new one
      jax.block_until_ready((holder[0], scalars))
      return float(scalars['loss'])

    start = time.perf_counter()
    run_steps(2)  # compiles, then one step as it will run
    info = dict(compile=time.perf_counter() - start, batch=n)
    return (lambda: run_steps(steps)), info

  common.serve(setup)


def run(quick):
  steps, repeats = (2 if quick else 5), common.MIN_REPEATS
  counts = (1, 8) if quick else DEVICE_COUNTS
  workers = {}
  try:
    for n in counts:
      flags = os.environ.get('XLA_FLAGS', '') + f' --xla_force_host_platform_device_count={n}'
      # Compiling the step takes most of this benchmark's time (~40 s a device count on 2
      # busy cores) and is not what it measures: later runs reuse the compiled steps.
      cache = os.environ.get('JAX_COMPILATION_CACHE_DIR',
                             os.path.join(common.ROOT, '.cache', 'bench-jax'))
      workers[n] = common.Worker('bench.sharding', [str(n), str(steps)],
                                 env=dict(XLA_FLAGS=flags.strip(), JAX_PLATFORMS='cpu',
                                          JAX_COMPILATION_CACHE_DIR=cache))
  except BaseException:
    for w in workers.values():
      w.kill()
    raise
  batch = workers[1].setup['batch']
  timed = common.time_workers(workers, repeats)
  rows = []
  for n in counts[1:]:
    rows.append(common.timed_record(
        f'train step on {n} simulated devices (global batch {batch})', 'ms/step',
        '1 device, same batch', timed,
        lambda t, n=n: (t[n] / steps * 1e3, t[1] / steps * 1e3, t[1] / t[n]),
        target='>= 0.8x', meets=lambda value, ratio: ratio >= 0.8,
        note=f'configs/grapheme.py:demo; {steps} steps per repeat; {os.cpu_count()} cores '
             'shared by all simulated devices'))
  return rows


if __name__ == '__main__':
  sys.exit(common.main(__doc__, run, _worker))
