"""Multi-host training on one machine, through launch.local and jax.distributed.

2 processes x 2 devices must train exactly as 1 process x 4 devices with the same global
batch; a dead process must end the job, not hang it; a checkpoint written by 2 processes must
resume in 1. Each run starts jax in fresh processes, so the file takes minutes: slow.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import ROOT, run_module

pytestmark = pytest.mark.slow

TASKS = {'grapheme': ('configs/grapheme.py:test', 'grapheme_data'),
         'fragments': ('configs/fragments.py:test', 'fragment_data')}
STEPS = 6  # the test configs save every 2 steps: 2, 4, 6


def two_processes(*module_args, grace=30):
  return ['launch.local', '--processes', '2', '--devices-per-process', '2',
          '--grace', str(grace), '--', *module_args]


def train_args(task, data, workdir, *extra):
  return ['launch.train', f'--config={TASKS[task][0]}', '--data', data, '--workdir', workdir,
          f'--config.train.steps={STEPS}', '--config.train.log_every=1', *extra]


def losses(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return {r['step']: r['loss'] for r in rows if 'loss' in r}


def logged(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  return os.path.exists(path) and os.path.getsize(path) > 0


def runs(task, request, tmp_path_factory):
  """(data, 1 process x 4 devices workdir, 2 processes x 2 devices workdir)."""
  data = request.getfixturevalue(TASKS[task][1])
  base = tmp_path_factory.mktemp(task)
  one, two = str(base / 'one_process'), str(base / 'two_processes')
  run_module(*train_args(task, data, one), devices=4)
  run_module(*two_processes(*train_args(task, data, two)))
  return data, one, two


@pytest.fixture(scope='module')
def grapheme_runs(request, tmp_path_factory):
  return runs('grapheme', request, tmp_path_factory)


@pytest.fixture(scope='module')
def fragments_runs(request, tmp_path_factory):
  return runs('fragments', request, tmp_path_factory)


@pytest.mark.parametrize('task', TASKS)
def test_two_processes_match_one(task, request):
  _, one, two = request.getfixturevalue(f'{task}_runs')
  one, two = losses(one), losses(two)
  steps = list(range(1, STEPS + 1))
  assert sorted(one) == sorted(two) == steps
  # Relative: the sums are ordered differently across processes, a few float32 ulps.
  np.testing.assert_allclose([two[s] for s in steps], [one[s] for s in steps], rtol=1e-6,
                             atol=0)


def test_checkpoint_of_two_processes_resumes_in_one(grapheme_runs, tmp_path):
  """Step 4 of the 2-process run, resumed by 1 process, continues as the 1-process run did."""
  data, one, two = grapheme_runs
  workdir = str(tmp_path / 'moved')
  shutil.copytree(two, workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', str(STEPS)))  # as if stopped after 4
  result = run_module(*train_args('grapheme', data, workdir), devices=4)
  assert 'Resumed from' in result.stdout and 'at step 4' in result.stdout, result.stdout
  resumed, uninterrupted = losses(workdir), losses(one)
  np.testing.assert_allclose([resumed[5], resumed[6]], [uninterrupted[5], uninterrupted[6]],
                             rtol=1e-6, atol=0)


class Job:
  """A 2-process training job under launch.local, its output lines collected as they come."""

  def __init__(self, args, grace):
    env = dict(os.environ, PYTHONPATH=ROOT)
    self.launcher = subprocess.Popen([sys.executable, '-m', *two_processes(*args, grace=grace)],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
    self.lines = []
    self.reader = threading.Thread(target=lambda: self.lines.extend(self.launcher.stdout),
                                   daemon=True)
    self.reader.start()

  def wait_for_a_step(self, workdir, timeout=600):
    deadline = time.monotonic() + timeout
    while not logged(workdir):
      assert self.launcher.poll() is None, self.log()[-5000:]
      assert time.monotonic() < deadline, f'no step logged in {timeout} s'
      time.sleep(0.2)

  def pid(self, process):
    [pid] = [int(m.group(1)) for line in self.lines
             if (m := re.match(rf'\[local\] process {process} pid (\d+)', line))]
    return pid

  def wait(self, timeout):
    try:
      self.launcher.wait(timeout=timeout)
    finally:
      if self.launcher.poll() is None:
        self.launcher.kill()
      self.reader.join()

  def log(self):
    return ''.join(self.lines)


def test_dead_process_ends_the_job(grapheme_data, tmp_path):
  """Process 1 is SIGKILLed mid-run: process 0 must fail by itself (heartbeat timeout 30 s)
  well before the launcher's grace period would make it stop it."""
  workdir = str(tmp_path / 'killed')
  job = Job(train_args('grapheme', grapheme_data, workdir, '--config.train.steps=100000',
                       '--config.train.checkpoint_every=100000'), grace=300)
  job.wait_for_a_step(workdir)
  os.kill(job.pid(1), signal.SIGKILL)
  killed = time.monotonic()
  job.wait(timeout=90)
  elapsed = time.monotonic() - killed
  log = job.log()
  assert job.launcher.returncode == 1
  assert elapsed < 90
  assert 'FAILED: process 1 failed first (was killed by SIGKILL)' in log, log[-3000:]
  assert re.search(r'\[local\] process 0 (was killed by SIG\w+|exited with status [1-9])', log)
  assert 'terminated by the launcher: []' in log  # process 0 stopped by itself


def test_preemption_notice_to_one_process_saves_the_same_step_everywhere(grapheme_data,
                                                                       tmp_path):
  """SIGTERM reaches only process 1 (its host is being preempted): JAX's preemption service
  makes both processes save one common step and exit 0."""
  workdir = str(tmp_path / 'preempted')
  job = Job(train_args('grapheme', grapheme_data, workdir, '--config.train.steps=100000',
                       '--config.train.checkpoint_every=100000'), grace=300)
  job.wait_for_a_step(workdir)
  os.kill(job.pid(1), signal.SIGTERM)
  job.wait(timeout=180)
  log = job.log()
  assert job.launcher.returncode == 0, log[-5000:]
  saved = {int(m.group(1)): int(m.group(2))
           for m in re.finditer(r'\[(\d)\] \[[\d:]+\] Preempted: saved step (\d+)', log)}
  assert sorted(saved) == [0, 1] and saved[0] == saved[1], log[-5000:]
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == [str(saved[0])]
