"""What a person sees while a job runs: a line for each phase, and progress that suits where
the output goes.

On a terminal, progress is a tqdm bar. Anywhere else (a SLURM log, a pod's logs, CI) a bar
writes hundreds of '\\r' updates into one enormous line, so progress is instead a plain line
every `LINE_SECONDS` (and one when the work ends), as cluster users expect.
Only process 0 speaks: on a multi-host job every other process stays quiet.
"""
import contextlib
import datetime
import multiprocessing
import signal
import sys
import threading
import time

import tqdm

LINE_SECONDS = 30.0  # between plain progress lines when the output is not a terminal


def speaks():
  # jax only when the program uses it: the data generators (and their worker processes)
  # report progress here without paying jax's import.
  jax = sys.modules.get('jax')
  return jax is None or jax.process_index() == 0


def on_terminal():
  return sys.stderr.isatty()  # tqdm draws on stderr


def say(message, every_process=False):
  """One timestamped line (through tqdm, so a bar on screen is redrawn below it), from
  process 0, or from each process with every_process (what each one did, e.g. saved)."""
  if every_process or speaks():
    tqdm.tqdm.write(f'[{time.strftime("%H:%M:%S")}] {message}', file=sys.stdout)
    sys.stdout.flush()


def show(text):
  """A run's result (a table, where its files are), as it is: no timestamp; process 0 only."""
  if speaks():
    print(text, flush=True)


def duration(seconds):
  """0:04:07 (h:mm:ss), for elapsed times and ETAs."""
  return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


class Progress:
  """Counts work done of `total` units: a tqdm bar on a terminal, else a plain line
  `WHAT: done/total (pct) rate, ETA` every LINE_SECONDS and a last one with the time taken.

    with console.Progress(len(files), 'converting', unit='file') as progress:
      for f in files:
        ...
        progress.update()
  """

  def __init__(self, total, what, unit='item'):
    """what=None counts silently (a caller's progress that its own caller did not ask for)."""
    self.total, self.what, self.unit = total, what, unit
    self.done, self.start = 0, time.perf_counter()
    self.last_line = self.start
    self.shown = what is not None and speaks()
    self.bar = (tqdm.tqdm(total=total, desc=what, unit=unit, dynamic_ncols=True)
                if self.shown and on_terminal() else None)

  def update(self, n=1):
    self.done += n
    if self.bar is not None:
      self.bar.update(n)
    elif self.shown and time.perf_counter() - self.last_line >= LINE_SECONDS:
      self.last_line = time.perf_counter()
      elapsed = self.last_line - self.start
      rate = self.done / max(elapsed, 1e-9)
      eta = (self.total - self.done) / rate if rate else float('inf')
      say(f'{self.what}: {self.done:,}/{self.total:,} {self.unit}s '
          f'({100 * self.done / max(self.total, 1):.0f} %), {rate:,.1f}/s, '
          f'ETA {duration(eta) if rate else "-"}')

  def close(self, finished=True):
    """finished=False (the work failed or was interrupted): no closing line, which would
    read like success."""
    if self.bar is not None:
      self.bar.close()
    elif self.shown and finished:
      say(f'{self.what}: {self.done:,} {self.unit}s in '
          f'{duration(time.perf_counter() - self.start)}')

  def __enter__(self):
    return self

  def __exit__(self, error_type, *exc):
    self.close(finished=error_type is None)


def _ignore_ctrl_c(initializer=None, *initargs):
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  if initializer is not None:
    initializer(*initargs)


@contextlib.contextmanager
def worker_pool(workers, context=None, initializer=None, initargs=()):
  """A multiprocessing Pool whose workers ignore Ctrl-C. Ctrl-C reaches every process of the
  terminal's group, and a worker's KeyboardInterrupt would print its own traceback, or end it
  holding its pool's queue lock (the parent's Pool.terminate then waits for that lock forever:
  seen with workers that exited on Ctrl-C). The parent alone stops (leaving the block
  terminates the workers) and says what was interrupted.

  A worker must ignore Ctrl-C from its first instruction, not from `_ignore_ctrl_c`: it
  imports and unpickles its job first, seconds on busy cores. While the pool starts, the
  parent holds Ctrl-C back (blocked, which fork keeps: it takes it once the pool is up) and
  ignores it (which exec keeps): a forkserver started then is born ignoring it, and gives
  its own workers the disposition it was born with. Blocking alone does not reach them: the
  forkserver forks with its own signal mask (seen: a worker still starting printed a
  KeyboardInterrupt's traceback when Ctrl-C came two seconds into the generator's run)."""
  held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  # signal.signal works in the main thread alone; elsewhere (a server's) Ctrl-C is not ours.
  main = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
  try:
    pool = multiprocessing.get_context(context).Pool(workers, _ignore_ctrl_c,
                                                     (initializer, *initargs))
  finally:
    if main:
      signal.signal(signal.SIGINT, previous)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
  with pool:
    yield pool


def text_table(header, rows):
  """Rows of cells as aligned plain text (numbers to 3 decimals), for a run's last words."""
  def cell(value):
    return f'{value:.3f}' if isinstance(value, float) else str(value)

  cells = [[cell(v) for v in row] for row in [header, *rows]]
  widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
  lines = ['  '.join(c.ljust(w) if i == 0 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


class TrainingProgress:
  """The training loop's progress: step, the last logged loss, images/s and an ETA.

  The rate counts steady-state steps only: from the end of the first step (which compiles)
  and without the time spent in `paused()` blocks (evaluations during training), so the ETA
  neither starts at hours nor jumps after each log line (tqdm's own estimate smooths over
  the bursts that asynchronous dispatch makes between log lines).
  """

  def __init__(self, total_steps, start_step, batch_size):
    self.total, self.step, self.batch_size = total_steps, start_step, batch_size
    self.steady = None  # (time, step) where steady-state timing starts
    self.excluded = 0.0  # seconds of paused() blocks since then
    self.loss = None
    self.last_line = time.perf_counter()
    self.bar = (tqdm.tqdm(total=total_steps, initial=start_step, unit='step',
                          dynamic_ncols=True, bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt} '
                          '[{elapsed}{postfix}]')
                if speaks() and on_terminal() else None)

  def start_steady(self):
    """Called once the first step has run (compiled, and its result waited for): the loop
    says so itself, so the next progress line comes LINE_SECONDS later."""
    self.steady, self.excluded = (time.perf_counter(), self.step), 0.0
    self.last_line = self.steady[0]

  def steps_per_s(self):
    if self.steady is None or self.step == self.steady[1]:
      return None
    return (self.step - self.steady[1]) / max(
        time.perf_counter() - self.steady[0] - self.excluded, 1e-9)

  def status(self):
    rate = self.steps_per_s()
    parts = [f'loss {self.loss:.3f}'] if self.loss is not None else []
    if rate:
      parts += [f'{rate * self.batch_size:,.0f} images/s',
                f'ETA {duration((self.total - self.step) / rate)}']
    return ', '.join(parts)

  def update(self, step, loss=None):
    """Step `step` was dispatched; `loss`: the latest logged loss, when there is a new one."""
    self.step = step
    if loss is not None:
      self.loss = float(loss)
    if self.bar is not None:
      self.bar.set_postfix_str(self.status(), refresh=False)
      self.bar.update(step - self.bar.n)
    elif speaks() and self.steady and (time.perf_counter() - self.last_line >= LINE_SECONDS
                                       or step == self.total):
      self.last_line = time.perf_counter()
      say(f'step {step:,}/{self.total:,} ({100 * step / self.total:.0f} %) {self.status()}')

  @contextlib.contextmanager
  def paused(self):
    """Time inside the block is not training time (it is left out of the rate)."""
    start = time.perf_counter()
    try:
      yield
    finally:
      self.excluded += time.perf_counter() - start

  def close(self):
    if self.bar is not None:
      self.bar.close()
