"""A run killed at any moment loses only the steps since its last checkpoint.

Killed with SIGKILL at seeded random moments (while the prepared cache is built, while an
asynchronous checkpoint save is written, and between steps) and rerun, a run ends bitwise
equal to an uninterrupted one (data order and input position, RNG, optimizer and EMA state,
counters); SIGTERM saves the current step and exits 0; NaN stops the run naming the step and
leaves the last good checkpoint intact; a full disk stops it naming the workdir and the space
left, and the rerun after freeing space resumes.
"""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import ROOT, run_module

STEPS = 16
# EMA and gradient accumulation on, so that their state is part of what must resume exactly
# (with BatchNorm, a coupled loss's chunks by their own statistics: accepted here).
EXACT = ['--config.train.checkpoint_every=4', '--config.train.log_every=1',
         '--config.train.ema_decay=0.9', '--config.train.grad_accum_steps=2',
         '--config.train.per_chunk_batch_stats=True']
# maskfeat: the pre-training task; saghog: the ViT fine-tune (NetRVLAD centres fitted on the
# data before step 1, layer-wise decay).
TASKS = {'grapheme': ('configs/grapheme.py:test', 'grapheme_data'),
         'fragments': ('configs/fragments.py:test', 'fragment_data'),
         'maskfeat': ('configs/maskfeat.py:test', 'fragment_data'),
         'saghog': ('configs/fragments.py:recipe=saghog,size=test', 'fragment_data')}


def train_args(task, data, workdir, steps=STEPS, extra=()):
  config, _ = TASKS[task]
  return [f'--config={config}', '--data', data, '--workdir', str(workdir),
          f'--config.train.steps={steps}', *EXACT, *extra]


def start(args):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=1')
  return subprocess.Popen([sys.executable, '-m', 'launch.train', *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def logged_step(workdir):
  try:
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      return max((json.loads(line)['step'] for line in f if line.endswith('\n')), default=0)
  except FileNotFoundError:
    return 0


def run_until(args, workdir, step, sig, timeout=300):
  """Starts a run, sends `sig` once it has logged `step`; returns (returncode, output)."""
  proc = start(args)
  deadline = time.time() + timeout
  while logged_step(workdir) < step:
    assert proc.poll() is None, f'the run ended before step {step}:\n{proc.stdout.read()}'
    assert time.time() < deadline, 'the run did not reach the kill step in time'
    time.sleep(0.01)
  proc.send_signal(sig)
  output, _ = proc.communicate(timeout=120)
  return proc.returncode, output


def final_state(workdir, step=STEPS):
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  return ocp.StandardCheckpointer().restore(path)


def assert_bitwise_equal(a, b):
  import jax
  paths_a, tree_a = jax.tree_util.tree_flatten_with_path(a)
  paths_b, tree_b = jax.tree_util.tree_flatten_with_path(b)
  assert tree_a == tree_b
  for (path, x), (_, y) in zip(paths_a, paths_b):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, jax.tree_util.keystr(path)
    assert x.tobytes() == y.tobytes(), f'{jax.tree_util.keystr(path)} differs after resuming'


def newer_than(pattern, since):
  """A path matching `pattern` created or changed since `since` (time.time()), else None: a
  killed run's leftovers, which the rerun removes, do not count."""
  for path in glob.glob(pattern):
    try:
      if os.stat(path).st_mtime >= since:
        return path
    except FileNotFoundError:  # renamed or removed meanwhile
      pass
  return None


def kill_when(args, found, delay=0.0, timeout=300):
  """Starts a run and SIGKILLs it `delay` s after found(started) first returns a path;
  returns whether that path still existed after the kill (the kill hit what it aimed at)."""
  started = time.time()
  proc = start(args)
  deadline = started + timeout
  while not (path := found(started)):
    assert proc.poll() is None, f'the run ended before it was killed:\n{proc.stdout.read()}'
    assert time.time() < deadline, 'the run never reached the moment to kill it'
    time.sleep(0.001)
  time.sleep(delay)
  proc.send_signal(signal.SIGKILL)
  output, _ = proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGKILL, output
  return os.path.exists(path)


def complete_steps(workdir):
  """The steps whose checkpoint is complete (Orbax renames a save to its step when done)."""
  try:
    return [int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')) if s.isdigit()]
  except FileNotFoundError:
    return []


def input_position(workdir, step=STEPS):
  """The grain iterator state each process saved at `step`."""
  files = sorted(glob.glob(os.path.join(workdir, 'checkpoints', str(step), 'data',
                                        'process_*.json')))
  assert files, f'no input position saved in {workdir} at step {step}'
  return {os.path.basename(f): open(f).read() for f in files}


@pytest.mark.slow
@pytest.mark.parametrize('task', sorted(TASKS))
def test_sigkill_at_random_moments_then_resume_is_bitwise_equal(task, tmp_path, request):
  seed = int(os.environ.get('BENGRAPHEME_KILL_SEED', random.randrange(2**31)))
  print(f'kill seed {seed} (rerun with BENGRAPHEME_KILL_SEED={seed})')
  rng = random.Random(seed)
  data = request.getfixturevalue(TASKS[task][1])
  reference = tmp_path / 'uninterrupted'
  run_module('launch.train', *train_args(task, data, reference))

  workdir = tmp_path / 'killed'
  args = train_args(task, data, workdir)
  # 1. While the prepared cache is built (it takes seconds: a kill within 0.2 s lands in it).
  building = lambda since: newer_than(f'{workdir}/prepared/.tmp-*', since)
  assert kill_when(args, building, delay=rng.uniform(0, 0.2)), f'seed {seed}'
  # 2. Between or during steps, at a random step and moment of the first half (the second
  # half's saves are for 3.), once the first checkpoint (step 4) is complete: every rerun
  # from here on must resume, not start over.
  kill_at = rng.randrange(4, STEPS // 2)
  logged = lambda since: (newer_than(f'{workdir}/metrics.jsonl', since)
                          if logged_step(workdir) >= kill_at and complete_steps(workdir)
                          else None)
  kill_when(args, logged, delay=rng.uniform(0, 0.3))
  # 3. While an asynchronous save is written: caught as its temporary folder appears (a save
  # takes ~0.1 s here, so a kill can come late: up to three tries, each one more kill).
  saving = lambda since: newer_than(f'{workdir}/checkpoints/*.orbax-checkpoint-tmp*', since)
  assert any(kill_when(args, saving) for _ in range(3)), f'no kill landed in a save; seed {seed}'
  complete = complete_steps(workdir)
  assert complete and STEPS not in complete

  result = run_module('launch.train', *args)
  assert f'Resumed from {workdir} at step {max(complete)}.' in result.stdout, result.stdout
  assert_bitwise_equal(final_state(str(reference)), final_state(str(workdir)))
  assert input_position(str(workdir)) == input_position(str(reference))
  # What the killed runs left half-written is gone.
  assert not glob.glob(f'{workdir}/prepared/.tmp-*')
  assert not glob.glob(f'{workdir}/checkpoints/*.orbax-checkpoint-tmp*')
  # The curves show every step once, with the uninterrupted run's values.
  with open(workdir / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f if 'loss' in line]
  with open(reference / 'metrics.jsonl') as f:
    expected = [json.loads(line) for line in f if 'loss' in line]
  assert [r['step'] for r in rows] == list(range(1, STEPS + 1))
  assert [r['loss'] for r in rows] == [r['loss'] for r in expected]


@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_exits_cleanly(grapheme_data, tmp_path):
  workdir = tmp_path / 'preempted'
  args = train_args('grapheme', grapheme_data, workdir, steps=10_000)
  began = time.time()
  returncode, output = run_until(args, str(workdir), 5, signal.SIGTERM)
  assert returncode == 0, output
  saved = int(output.split('Preempted: saved step ')[1].split(';')[0])
  assert 5 <= saved < 10_000
  assert str(saved) in os.listdir(workdir / 'checkpoints')
  assert time.time() - began < 300
  result = run_module('launch.train', *train_args('grapheme', grapheme_data, workdir,
                                                   steps=saved + 2))
  assert f'at step {saved}' in result.stdout


@pytest.mark.slow
def test_ctrl_c_saves_the_current_step_and_the_rerun_resumes(grapheme_data, tmp_path):
  workdir = tmp_path / 'interrupted'
  args = train_args('grapheme', grapheme_data, workdir, steps=10_000)
  returncode, output = run_until(args, str(workdir), 5, signal.SIGINT)
  assert returncode == 130, output  # a script's `train && evaluate` stops here
  assert 'Traceback' not in output
  saved = int(output.split('Interrupted: saved step ')[1].split(';')[0])
  assert 5 <= saved < 10_000
  assert str(saved) in os.listdir(workdir / 'checkpoints')
  result = run_module('launch.train', *train_args('grapheme', grapheme_data, workdir,
                                                   steps=saved + 2))
  assert f'at step {saved}' in result.stdout


@pytest.mark.slow
def test_ctrl_c_before_the_first_step_stops_at_once_and_the_rerun_trains(grapheme_data,
                                                                          tmp_path):
  workdir = tmp_path / 'early'
  args = train_args('grapheme', grapheme_data, workdir, steps=2)
  proc = start(args)
  output = ''
  for line in proc.stdout:  # Ctrl-C while the model is being built: nothing saved yet
    output += line
    if 'Initialising the model' in line:
      proc.send_signal(signal.SIGINT)
      break
  output += proc.communicate(timeout=300)[0]
  assert proc.returncode == 130, output
  assert ('Interrupted (Ctrl-C), stopped at once: none saved; rerun the same command to '
          'resume.') in output, output
  result = run_module('launch.train', *args)  # as said
  assert os.path.isdir(workdir / 'checkpoints' / '2'), result.stdout[-2000:]


def logged_rows(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return [{k: v for k, v in row.items() if k != 'images_per_s'} for row in rows]


@pytest.mark.slow
def test_log_rows_after_a_resume_equal_an_uninterrupted_runs(grapheme_data, tmp_path):
  """Resumed from step 4, in the middle of a log interval (rows every 3 steps), the rerun
  logs the rows the uninterrupted run logged: the interval's sums were saved at step 4."""
  workdir = tmp_path / 'run'
  args = train_args('grapheme', grapheme_data, workdir, steps=12, extra=[
      '--config.train.log_every=3', '--config.train.keep_checkpoints=5'])
  run_module('launch.train', *args)
  uninterrupted = logged_rows(workdir)
  assert [row['step'] for row in uninterrupted] == [3, 6, 9, 12]
  for step in (8, 12):  # as if the run had died after saving step 4
    shutil.rmtree(workdir / 'checkpoints' / str(step))
  result = run_module('launch.train', *args)
  assert 'at step 4' in result.stdout
  assert logged_rows(workdir) == uninterrupted
  with open(workdir / 'metrics.jsonl') as f:
    rates = [json.loads(line).get('images_per_s') for line in f]
  assert all(rate and rate > 0 for rate in rates)  # every row after the first step has one


@pytest.mark.slow
def test_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(grapheme_data,
                                                                      tmp_path):
  workdir = tmp_path / 'nan'
  # A learning rate this large overflows the weights within a few steps.
  args = train_args('grapheme', grapheme_data, workdir, steps=12,
                    extra=['--config.train.lr=1e30', '--config.train.grad_clip=1e30',
                           '--config.train.checkpoint_every=1'])
  result = run_module('launch.train', *args, check=False)
  assert result.returncode == 1
  assert 'Traceback' not in result.stderr  # one line a user can act on
  message = result.stderr.split('Error: ')[1]
  bad = int(message.split('NaN/Inf at step ')[1].split(';')[0])
  kept = sorted(int(s) for s in os.listdir(workdir / 'checkpoints') if s.isdigit())
  assert kept and max(kept) < bad
  state = final_state(str(workdir), max(kept))
  import jax
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state['params']))

  skipped = tmp_path / 'skip'
  run_module('launch.train', *train_args(
      'grapheme', grapheme_data, skipped, steps=12,
      extra=['--config.train.lr=1e30', '--config.train.grad_clip=1e30',
             '--config.train.skip_nonfinite=True']))
  with open(skipped / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f if 'loss' in line]
  assert sum(r['nonfinite'] for r in rows) > 0
  state = final_state(str(skipped), 12)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state['params']))


@pytest.mark.slow
def test_full_disk_stops_naming_the_space_left_and_the_rerun_resumes(grapheme_data, tmp_path,
                                                                    small_disk):
  """The workdir is on a small tmpfs, filled up while the run trains, once step 2 is saved, to
  half a checkpoint's size: a later save fails. (The prepared data goes elsewhere.)"""
  workdir = small_disk('64m') / 'run'
  args = lambda steps: ['--config=configs/grapheme.py:test', '--data', grapheme_data,
                        '--workdir', str(workdir), f'--config.train.steps={steps}',
                        f'--config.data.cache_dir={tmp_path / "prepared"}']
  proc = start(args(100_000))
  deadline = time.time() + 300
  while not os.path.isdir(workdir / 'checkpoints' / '2'):
    assert proc.poll() is None, proc.stdout.read()
    assert time.time() < deadline, 'no checkpoint in time'
    time.sleep(0.05)
  checkpoint_bytes = sum(os.path.getsize(p) for p in
                         glob.glob(f'{workdir}/checkpoints/2/**', recursive=True)
                         if os.path.isfile(p))
  filler = workdir.parent / 'filler'
  with open(filler, 'wb') as f:
    os.posix_fallocate(f.fileno(), 0,
                       os.statvfs(workdir).f_bavail * os.statvfs(workdir).f_frsize
                       - checkpoint_bytes // 2)
  message, _ = proc.communicate(timeout=300)
  assert proc.returncode == 1, message[-3000:]
  kept = max(int(s) for s in os.listdir(workdir / 'checkpoints') if s.isdigit())
  assert f'Out of disk space writing to {workdir} (' in message, message[-3000:]
  assert 'MiB free of 64.0 MiB once the partial save was removed' in message
  assert f'{workdir}/checkpoints/{kept}, is intact and restorable' in message
  assert 'Training stopped; the newest complete checkpoint' in message
  assert 'rerun the same command to resume.' in message
  # Orbax logs the failed write's traceback, but the trainer ends with the message above, not
  # with a traceback through its own code.
  assert 'launch/train.py' not in message, message[-3000:]
  assert not glob.glob(f'{workdir}/checkpoints/*.orbax-checkpoint-tmp*')  # partial removed

  os.remove(filler)
  result = run_module('launch.train', *args(kept + 2))
  assert f'Resumed from {workdir} at step {kept}.' in result.stdout, result.stdout
  assert os.path.isdir(workdir / 'checkpoints' / str(kept + 2))


@pytest.mark.slow
def test_a_run_that_fails_releases_the_workdir_and_signal_handlers(grapheme_data, tmp_path):
  """An in-process caller (a notebook, a sweep) goes on after a failed run: the workdir lock,
  the SIGTERM / Ctrl-C handlers and the checkpoint manager are released whatever the error."""
  from bengrapheme import train, workdir_lock
  from configs import grapheme
  config = grapheme.get_config('test')
  config.data.dir = grapheme_data
  config.train.update(steps=12, lr=1e30, grad_clip=1e30, checkpoint_every=1)
  handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  with pytest.raises(train.NonFinite):
    train.train(config, str(tmp_path / 'run'))
  assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
  assert workdir_lock._held == {}
