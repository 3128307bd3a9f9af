"""What the bench modules share: timing, result records, worker processes, synthetic data.

Timing: contenders are timed in turns (A, B, A, B, ...), at least MIN_REPEATS turns, so that
load from other processes on a shared machine hits both sides of a ratio alike. A timed row
(`timed_record`) holds the ratio of every turn, their median, min and max, the load average
before and after, and a verdict that needs every turn to agree: one draw is not a figure.

Workers: a contender that must run in a process of its own (its peak memory is measured, or
it needs XLA_FLAGS set before jax starts) is a `Worker`: a child process that sets up once
(data, compilation) and then times one repeat per request, so that several of them can still
take turns. Its peak RSS is the kernel's high-water mark of that process (VmHWM).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import typing

import numpy as np

from bengrapheme.grapheme import kaggle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- timing and records


class Timed(typing.NamedTuple):
  """What a contender returns when it times a part of its work itself (e.g. after warm-up)."""
  seconds: float
  result: object


# Fewer turns than this cannot tell a difference from the noise of a shared machine.
MIN_REPEATS = 5


class Turns(dict):
  """{name: (fastest seconds, last result[, peak RSS])} of contenders timed in turns, with
  `each`: one {name: seconds} a turn, and `load`: the 1-minute load average before and after."""

  def __init__(self, best, each, load):
    super().__init__(best)
    self.each, self.load = each, load


def load_average():
  return os.getloadavg()[0]


# How long a row waits for the machine to quiet down before its turns. The 1-minute load
# average also counts the bench's own compiling and setting up just before; left alone a
# few seconds, it falls below the cores unless other processes keep it up (then: busy).
QUIET_SECONDS = float(os.environ.get('BENCH_QUIET_SECONDS', 180))


def quiet_load_average(cores=None, timeout=None):
  """The 1-minute load average once it is at most the core count, or when `timeout`
  seconds have passed (then above it: the verdict is 'busy')."""
  cores = cores or os.cpu_count()
  deadline = time.monotonic() + (QUIET_SECONDS if timeout is None else timeout)
  while (load := load_average()) > cores and time.monotonic() < deadline:
    time.sleep(1)
  return load


def interleaved(contenders, repeats):
  """{name: fn} -> Turns {name: (fastest seconds, last result)}, running the fns in turns.

  A fn is timed around its call, unless it returns `Timed`.
  """
  before, each, last = quiet_load_average(), [], {}
  for _ in range(repeats):
    turn = {}
    for name, fn in contenders.items():
      start = time.perf_counter()
      result = fn()
      seconds = time.perf_counter() - start
      if isinstance(result, Timed):
        seconds, result = result
      turn[name], last[name] = seconds, result
    each.append(turn)
  best = {name: (min(t[name] for t in each), last[name]) for name in contenders}
  return Turns(best, each, (before, load_average()))


def settle(interval=0.05, busy=0.1, timeout=60):
  """Waits until this process's threads have stopped working (e.g. a closed pipeline's
  read-ahead), so that leftover work does not run in the next contender's time."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    cpu = time.process_time()
    time.sleep(interval)
    if time.process_time() - cpu < busy * interval:
      return


def record(name, value, unit, reference, reference_value, *, ratio, target=None, passed=None,
           note=None):
  """An untimed row (a size, a peak memory, one long run): one measurement, its verdict
  pass or miss by `passed`. Rows timed in turns are `timed_record`'s."""
  row = dict(name=name, value=float(value), unit=unit, reference=reference,
             reference_value=None if reference_value is None else float(reference_value),
             ratio=None if ratio is None else float(ratio), target=target,
             verdict=None if passed is None else ('pass' if passed else 'miss'))
  if note:
    row['note'] = note
  return row


def timed_record(name, unit, reference, turns, figures, *, target=None, meets=None, note=None):
  """A row timed in turns: `figures(turn)` -> (value, reference value or None, ratio or None)
  for each turn of `turns` (a {name: seconds}); `meets(value, ratio)` says whether one turn
  clears `target`. value, reference_value and ratio are the medians over the turns;
  `repeats` holds each turn's ratio (its value where there is no ratio)."""
  if (target is None) != (meets is None):
    raise ValueError(f'bench row {name!r}: a target needs meets(value, ratio), and the reverse')
  each = [figures(turn) for turn in turns.each]
  median = lambda xs: None if xs[0] is None else float(np.median(xs))
  value, reference_value, ratio = (median([f[i] for f in each]) for i in range(3))
  repeats = [float(f[2] if ratio is not None else f[0]) for f in each]
  row = dict(name=name, value=value, unit=unit, reference=reference,
             reference_value=reference_value, ratio=ratio, target=target,
             verdict=verdict([meets(f[0], f[2]) for f in each] if meets else None,
                             turns.load[0]),
             repeats=repeats, median=float(np.median(repeats)), min=min(repeats),
             max=max(repeats), load_average=list(turns.load))
  if note:
    row['note'] = note
  return row


def verdict(met, load, cores=None):
  """A timed row's verdict from whether each turn met the target: 'pass' when every turn
  did (the worst clears it), 'miss' when none did (not even the best), 'within noise'
  otherwise; 'busy', no verdict, when the 1-minute load average at the start exceeded the
  core count, since the two sides then shared the cores with others. None: no target."""
  if met is None:
    return None
  if load > (cores or os.cpu_count()):
    return 'busy'
  return 'pass' if all(met) else 'miss' if not any(met) else 'within noise'


def peak_rss():
  """This process's peak resident memory in bytes (VmHWM)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmHWM:'):
        return int(line.split()[1]) * 1024
  raise RuntimeError('no VmHWM in /proc/self/status')


def main(doc, run, worker=None):
  """A bench module's command line: --quick (reduced sizes), then its rows as JSON lines.
  With `worker`, the hidden --worker ARGS... that `Worker` starts its child with runs
  worker(*ARGS) instead (ARGS as strings)."""
  parser = argparse.ArgumentParser(description=doc.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  if worker:
    parser.add_argument('--worker', nargs='+', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if getattr(args, 'worker', None):
    return worker(*args.worker)
  for row in run(args.quick):
    print(json.dumps(row))


# ---------------------------------------------------------------- worker processes


class Worker:
  """A child `python -m MODULE --worker ARGS...` serving one contender (see `serve`).

  The child starts at once and runs the contender's setup (data, compilation); several can
  set up side by side (compilers are mostly single-threaded). `setup` waits for it and holds
  what it reported; `time()` runs one repeat there and returns (seconds, result); `close()`
  returns its peak RSS in bytes.
  """

  def __init__(self, module, args, env=None):
    environ = dict(os.environ, **(env or {}))
    environ['PYTHONPATH'] = os.pathsep.join(filter(None, [ROOT, environ.get('PYTHONPATH')]))
    self.name = ' '.join(args)
    self._proc = subprocess.Popen([sys.executable, '-m', module, '--worker', *args],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environ,
                                  cwd=ROOT, text=True)
    self._setup = None

  @property
  def setup(self):
    if self._setup is None:
      self._setup = self._reply()
    return self._setup

  def _reply(self):
    line = self._proc.stdout.readline()
    if not line:
      code = self._proc.wait()
      raise RuntimeError(f'bench worker {self.name!r} exited with code {code}')
    return json.loads(line)

  def _ask(self, command):
    _ = self.setup  # its reply comes first on the pipe
    self._proc.stdin.write(command + '\n')
    self._proc.stdin.flush()
    return self._reply()

  def time(self):
    reply = self._ask('run')
    return reply['seconds'], reply['result']

  def close(self):
    reply = self._ask('quit')
    self._proc.wait()
    return reply['peak_rss']

  def kill(self):
    if self._proc.poll() is None:
      self._proc.kill()
      self._proc.wait()


def time_workers(workers, repeats):
  """{name: Worker} -> Turns {name: (fastest seconds, last result, peak RSS bytes)}, in turns.

  Seconds are those the worker measured around the contender alone. The workers are closed
  (or killed, on an error) before this returns.
  """
  try:
    before, each, last = quiet_load_average(), [], {}
    for _ in range(repeats):
      turn = {}
      for name, worker in workers.items():
        turn[name], last[name] = worker.time()
      each.append(turn)
    best = {name: (min(t[name] for t in each), last[name], workers[name].close())
            for name in workers}
    return Turns(best, each, (before, load_average()))
  finally:
    for worker in workers.values():
      worker.kill()


def serve(setup):
  """The child side of `Worker`: `setup()` -> (run_once, info); then one line per request.

  stdout carries the protocol, so anything else written to it, by Python or by C code,
  goes to stderr.
  """
  sys.stdout.flush()
  out = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  run_once, info = setup()
  print(json.dumps(info or {}), file=out, flush=True)
  for line in sys.stdin:
    command = line.strip()
    if command == 'run':
      start = time.perf_counter()
      result = run_once()
      print(json.dumps(dict(seconds=time.perf_counter() - start, result=result)), file=out,
            flush=True)
    elif command == 'quit':
      print(json.dumps(dict(peak_rss=peak_rss())), file=out, flush=True)
      return
    else:
      raise ValueError(f'bench worker: unknown command {command!r}')


# ---------------------------------------------------------------- synthetic Kaggle data


def synthetic_images(n, seed):
  """Image-like pixels: near-white paper noise with a few dark strokes, so that they compress
  and decode like the real scans (pure noise or blank images would not)."""
  rng = np.random.default_rng(seed)
  images = (250 + rng.integers(0, 6, (n, kaggle.HEIGHT, kaggle.WIDTH))).astype(np.uint8)
  rows = np.arange(n)[:, None]
  for _ in range(6):
    y = rng.integers(8, kaggle.HEIGHT - 8, (n, 1)) + rng.integers(-4, 5, (1, 60))
    x = rng.integers(8, kaggle.WIDTH - 28, (n, 1)) + np.arange(60)[None] // 3
    images[rows, np.clip(y, 0, kaggle.HEIGHT - 1), np.clip(x, 0, kaggle.WIDTH - 1)] = (
        rng.integers(0, 60, (n, 60)))
  return images


def write_data_dir(path, n, seed, shards=1):
  """A train split of n images in the Kaggle layout, spread over the first `shards` of the
  four image files (the others empty; 1 by default, as real shards are large)."""
  rng = np.random.default_rng(seed)
  ids = [f'Train_{i}' for i in range(n)]
  images = synthetic_images(n, seed)
  bounds = np.linspace(0, n, shards + 1).astype(int)
  for shard in range(kaggle.NUM_SHARDS):
    part = slice(*bounds[shard:shard + 2]) if shard < shards else slice(0, 0)
    kaggle.write_image_parquet(path / kaggle.image_parquet_name('train', shard), ids[part],
                               images[part])
  labels = np.stack([rng.integers(0, c, n) for c in kaggle.NUM_CLASSES], 1)
  lines = [','.join(kaggle.LABEL_COLUMNS)]
  lines += [f'{image_id},{r},{v},{c},x' for image_id, (r, v, c) in zip(ids, labels)]
  (path / 'train.csv').write_text('\n'.join(lines) + '\n')


def pandas_load(parquet_path):
  """The way public Kaggle notebooks read this data: the whole wide file through pandas."""
  import pandas as pd  # only the references need pandas
  frame = pd.read_parquet(parquet_path)
  return frame.drop(columns='image_id').to_numpy().reshape(-1, kaggle.HEIGHT, kaggle.WIDTH)


def pandas_load_split(data_dir, split='train'):
  """All of a split's image files loaded that way, in one array (notebooks concatenate them)."""
  return np.concatenate([pandas_load(os.path.join(data_dir, kaggle.image_parquet_name(split, i)))
                         for i in range(kaggle.NUM_SHARDS)])


def pandas_batches(images, batch, seed=0):
  """Shuffled uint8 batches from the loaded array, as those notebooks' generators make them."""
  order = np.random.default_rng(seed).permutation(len(images))
  for begin in range(0, len(images), batch):
    yield np.ascontiguousarray(images[order[begin:begin + batch]])


def pandas_reference(parquet_path, batch):
  """Images per second the Kaggle-notebook way: (load + batches, batches once loaded)."""
  start = time.perf_counter()
  images = pandas_load(parquet_path)
  loaded = time.perf_counter()
  for _ in pandas_batches(images, batch):
    pass
  end = time.perf_counter()
  return len(images) / (end - start), len(images) / (end - loaded)


def trainer_step(config, task, host_batch):
  """The trainer's own jitted step for `config`: (state, jitted step, global batch)."""
  import jax
  from bengrapheme import parallel, train
  mesh = parallel.make_mesh(config.mesh)
  graphdef, state = train.init_state(config, task, mesh)
  shardings = jax.tree.map(lambda x: x.sharding, state)
  jitted = train.make_train_step(config, task, graphdef, mesh, shardings)
  return state, jitted, parallel.global_batch(mesh, host_batch)
