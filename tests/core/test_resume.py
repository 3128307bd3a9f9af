"""A run killed at any moment loses only the steps since its last checkpoint.

Killed with SIGKILL twice and rerun, a run ends bitwise equal to an uninterrupted one (data
order, RNG, optimizer and EMA state, counters); SIGTERM saves the current step and exits 0;
NaN stops the run naming the step and leaves the last good checkpoint intact.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import ROOT, run_module

STEPS = 16
# EMA and gradient accumulation on, so that their state is part of what must resume exactly.
EXACT = ['--config.train.checkpoint_every=4', '--config.train.log_every=1',
         '--config.train.ema_decay=0.9', '--config.train.grad_accum_steps=2']
TASKS = {'grapheme': ('configs/grapheme.py:test', 'grapheme_data'),
         'fragments': ('configs/fragments.py:test', 'fragment_data')}


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


@pytest.mark.slow
@pytest.mark.parametrize('task', sorted(TASKS))
def test_sigkill_twice_then_resume_is_bitwise_equal(task, tmp_path, request):
  data = request.getfixturevalue(TASKS[task][1])
  reference = tmp_path / 'uninterrupted'
  run_module('launch.train', *train_args(task, data, reference))

  workdir = tmp_path / 'killed'
  args = train_args(task, data, workdir)
  # Kill points between checkpoints (every 4 steps), the second one after a resume.
  for kill_at in (6, 11):
    returncode, output = run_until(args, str(workdir), kill_at, signal.SIGKILL)
    assert returncode == -signal.SIGKILL, output
    assert not os.path.exists(os.path.join(workdir, 'checkpoints', str(STEPS)))
  result = run_module('launch.train', *args)
  assert 'Resumed from' in result.stdout
  assert_bitwise_equal(final_state(str(reference)), final_state(str(workdir)))
  # The curves show every step once, with the uninterrupted run's values.
  with open(workdir / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f if 'loss' in line]
  with open(reference / 'metrics.jsonl') as f:
    expected = [json.loads(line) for line in f if 'loss' in line]
  assert [r['step'] for r in rows] == list(range(1, STEPS + 1))
  assert [r['loss'] for r in rows] == [r['loss'] for r in expected]


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


def test_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(grapheme_data,
                                                                      tmp_path):
  workdir = tmp_path / 'nan'
  # A learning rate this large overflows the weights within a few steps.
  args = train_args('grapheme', grapheme_data, workdir, steps=12,
                    extra=['--config.train.lr=1e30', '--config.train.grad_clip=1e30',
                           '--config.train.checkpoint_every=1'])
  result = run_module('launch.train', *args, check=False)
  assert result.returncode != 0
  message = result.stderr.split('FloatingPointError: ')[1]
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
