"""One run owns a workdir: a second trainer refuses before any work, naming the holder; a
killed holder never blocks the rerun; a bucket workdir's lease expires and is renewed; a
multi-process job holds one lock; evaluate and predict read beside a training run."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from bengrapheme import workdir_lock
from conftest import ROOT, run_module

HOLD = '''
import os, sys, time
from bengrapheme import workdir_lock
workdir_lock.{kind}(sys.argv[1]{args}).acquire()
started, running = os.pipe()
child = os.fork() if sys.argv[2] == 'fork' else -1  # a child that outlives its killed parent
if child == 0:
  os.write(running, b'.')  # past fork's hooks: it has closed its copy of the lock
  time.sleep(120)
  os._exit(0)
if child > 0:
  os.read(started, 1)  # killed before its child first ran, the child would still hold it
print('held', child, flush=True)
time.sleep(120)
'''


def holder(workdir, kind='FileLock', args='', fork=False):
  """A process that holds `workdir` until killed; with fork=True it has a child, whose pid
  is proc.child."""
  proc = subprocess.Popen(
      [sys.executable, '-c', HOLD.format(kind=kind, args=args), str(workdir),
       'fork' if fork else 'no'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu'),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  line = proc.stdout.readline()
  assert line.startswith('held '), proc.stderr.read()
  proc.child = int(line.split()[1])
  return proc


@pytest.mark.slow
def test_second_trainer_refuses_at_once_naming_the_holder(grapheme_data, tmp_path):
  workdir = tmp_path / 'run'
  proc = holder(workdir)
  began = time.monotonic()
  result = run_module('launch.train', '--config=configs/grapheme.py:test', '--data',
                      grapheme_data, '--workdir', workdir, check=False)
  assert result.returncode == 1, result.stderr[-3000:]
  assert time.monotonic() - began < 60
  message = result.stderr
  assert f'Not training: {workdir} is in use by another training run' in message, message
  assert f'pid {proc.pid} on host {socket.gethostname()}, started ' in message
  assert 'rerun this command to resume' in message and 'launch.evaluate' in message
  assert 'Traceback' not in message
  assert sorted(os.listdir(workdir)) == ['lock']  # no work done: no config, logs, cache
  proc.kill()
  proc.wait()


@pytest.mark.parametrize('fork', [False, True], ids=['holder', 'holder_with_child'])
def test_a_killed_holder_never_blocks_the_rerun(tmp_path, fork):
  proc = holder(tmp_path, fork=fork)
  with pytest.raises(workdir_lock.Busy, match=f'pid {proc.pid} '):
    workdir_lock.acquire(tmp_path)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  try:
    workdir_lock.acquire(tmp_path)  # at once: the OS dropped the dead process's lock
    workdir_lock.release(tmp_path)
  finally:
    if fork:
      os.kill(proc.child, signal.SIGKILL)


def test_bucket_lease_is_renewed_expires_and_refuses_a_second_holder(tmp_path):
  """The lease a bucket workdir gets, exercised on a local folder with a 1 s lease."""
  first = workdir_lock.Lease(str(tmp_path), lease_s=1.0, settle_s=0.1)
  first.acquire()
  time.sleep(2.5)  # past its first expiry: the heartbeat renewed it
  second = workdir_lock.Lease(str(tmp_path), lease_s=1.0, settle_s=0.1)
  with pytest.raises(workdir_lock.Busy, match=rf'pid {os.getpid()} .* expires in \d+ s'):
    second.acquire()
  first.release()
  assert not (tmp_path / 'lock.json').exists()
  second.acquire()  # released: taken at once
  second.stop.set()  # dies without releasing: the lease stays until it expires
  second.thread.join()
  third = workdir_lock.Lease(str(tmp_path), lease_s=1.0, settle_s=0.1)
  with pytest.raises(workdir_lock.Busy):
    third.acquire()
  time.sleep(1.1)
  third.acquire()
  third.release()


RACE = '''
import sys
from bengrapheme import workdir_lock
print('ready', flush=True)
sys.stdin.readline()  # both start when the test says go
try:
  workdir_lock.Lease(sys.argv[1], lease_s=5.0, settle_s=1.0).acquire()
  print('held')
except workdir_lock.Busy:
  print('refused')
'''


def test_bucket_lease_of_two_simultaneous_starts_goes_to_one(tmp_path):
  """Two hosts (processes) that find no lease and start within the same instant."""
  procs = [subprocess.Popen([sys.executable, '-c', RACE, str(tmp_path)], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu'),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  for proc in procs:
    assert proc.stdout.readline() == 'ready\n', proc.stderr.read()
  for proc in procs:
    proc.stdin.write('go\n')
    proc.stdin.flush()
  outcomes = [proc.communicate(timeout=60) for proc in procs]
  assert sorted(out.strip() for out, _ in outcomes) == ['held', 'refused'], outcomes


def test_a_holder_whose_lease_was_taken_stops_at_once(tmp_path):
  proc = holder(tmp_path, kind='Lease', args=', lease_s=1.0, settle_s=0.1')
  lease = json.loads((tmp_path / 'lock.json').read_text())
  (tmp_path / 'lock.json').write_text(json.dumps(dict(lease, token='another run')))
  assert proc.wait(timeout=30) == 75
  assert f'Lost the lease on {tmp_path}' in proc.stderr.read()


@pytest.mark.slow
def test_a_refused_multiprocess_job_ends_in_every_process(grapheme_data, tmp_path):
  """Process 0 is refused; process 1, which takes no lock, learns it and ends too, without
  waiting for the launcher's grace period."""
  workdir = tmp_path / 'run'
  proc = holder(workdir)
  began = time.monotonic()
  result = run_module('launch.local', '--processes', 2, '--grace', 300, '--',
                      'launch.train', '--config=configs/grapheme.py:test', '--data',
                      grapheme_data, '--workdir', workdir, check=False)
  log = result.stdout + result.stderr
  assert result.returncode == 1, log[-3000:]
  assert time.monotonic() - began < 120, log[-3000:]
  assert f'[0] Error: Not training: {workdir} is in use by another training run: pid {proc.pid}' in log, log[-3000:]
  assert 'process 0 of this job could not lock it' in log, log[-3000:]
  assert 'terminated by the launcher: []' in log  # both ended by themselves
  assert sorted(os.listdir(workdir)) == ['lock']
  proc.kill()
  proc.wait()


@pytest.mark.slow
def test_second_run_refused_while_the_first_trains_and_evaluate_reads_beside_it(
    grapheme_data, tmp_path):
  """A user's slip: the same command started twice, 2 s apart; and evaluate while the run
  trains."""
  workdir = tmp_path / 'run'
  args = ['--config=configs/grapheme.py:test', '--data', grapheme_data, '--workdir',
          str(workdir), '--config.train.steps=100000', '--config.train.log_every=1']
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=1')
  first = subprocess.Popen([sys.executable, '-m', 'launch.train', *args], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    time.sleep(2)
    second = run_module('launch.train', *args, check=False)
    assert second.returncode == 1 and f'pid {first.pid} on host' in second.stderr, (
        second.stderr[-3000:])
    deadline = time.monotonic() + 300
    while not [s for s in os.listdir(workdir / 'checkpoints') if s.isdigit()] \
        if (workdir / 'checkpoints').exists() else True:
      assert first.poll() is None and time.monotonic() < deadline
      time.sleep(0.5)
    # launch.predict reads through the same read-only restored.trained_model.
    result = run_module('launch.evaluate', *args)
    step = int(result.stdout.split('Using the checkpoint of step ')[1].split()[0])
    assert json.loads((workdir / 'eval' / 'metrics.json').read_text())['step'] == step >= 2
  finally:
    first.send_signal(signal.SIGTERM)  # saves its step and exits 0
    output, _ = first.communicate(timeout=300)
  assert first.returncode == 0, output[-3000:]
  with open(workdir / 'metrics.jsonl') as f:
    steps = [json.loads(line)['step'] for line in f if 'loss' in line]
  assert steps == list(range(1, len(steps) + 1))  # one writer: each step once
  # As the refusal said: once the first run is stopped, the same command resumes its work.
  rerun = subprocess.Popen([sys.executable, '-m', 'launch.train', *args], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  said = ''
  try:
    for line in rerun.stdout:
      said += line
      if 'Resumed from' in line or 'Error' in line:
        break
  finally:
    rerun.send_signal(signal.SIGTERM)
    said += rerun.communicate(timeout=300)[0]
  assert f'Resumed from {workdir} at step {steps[-1]}.' in said, said[-3000:]
