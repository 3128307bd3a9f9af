"""Errors a user can fix end an entry point with one line and status 1, before slow work,
leaving nothing behind; --traceback (or BENGRAPHEME_TRACEBACK=1) shows the traceback. Ctrl-C
while data is written says what was interrupted, in one line, and leaves nothing."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_module

TRAIN = ('launch.train', '--config=configs/grapheme.py:test')


def one_line_error(result):
  """The message of a run that ended with one line on stderr, status 1."""
  assert result.returncode == 1, result.stdout + result.stderr
  assert 'Traceback' not in result.stdout + result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  return lines[0]


def test_missing_data_folder_is_named_and_nothing_is_created(tmp_path):
  workdir = tmp_path / 'work'
  result = run_module(*TRAIN, '--data', tmp_path / 'no-such-data', '--workdir', workdir,
                      check=False)
  assert result.returncode == 1
  assert f'{tmp_path / "no-such-data"}: no such folder' in result.stderr
  assert 'Traceback' not in result.stderr
  assert not workdir.exists()


@pytest.mark.parametrize('config, expected', [
    ('configs/grapheme.py:test', 'train.csv: file is missing'),
    ('configs/fragments.py:test', 'train: no such folder'),
])
def test_empty_data_folder_gives_one_line_and_creates_no_workdir(tmp_path, config, expected):
  (tmp_path / 'data').mkdir()
  workdir = tmp_path / 'work'
  result = run_module('launch.train', f'--config={config}', '--data', tmp_path / 'data',
                      '--workdir', workdir, check=False)
  message = one_line_error(result)
  assert message.startswith(f'Error: {tmp_path / "data"}') and expected in message, message
  assert not workdir.exists()  # no workdir, no lock


@pytest.mark.slow
@pytest.mark.parametrize('module', ['launch.predict', 'launch.evaluate'])
def test_workdir_without_checkpoint_gives_one_line_before_building_the_model(tmp_path,
                                                                             module):
  workdir = tmp_path / 'work'
  workdir.mkdir()
  began = time.time()
  result = run_module(module, '--config=configs/grapheme.py:test', '--workdir', workdir,
                      check=False)
  message = one_line_error(result)
  assert message.startswith(f'Error: no checkpoint in {workdir / "checkpoints"}'), message
  assert list(workdir.iterdir()) == []
  assert time.time() - began < 30  # found before the model is built
  missing = run_module(module, '--config=configs/grapheme.py:test', '--workdir',
                       tmp_path / 'nowhere', check=False)
  assert one_line_error(missing).startswith(f'Error: --workdir {tmp_path / "nowhere"}: no '
                                            'such folder')
  assert not (tmp_path / 'nowhere').exists()


@pytest.mark.slow
def test_traceback_on_request(tmp_path):
  args = ('launch.predict', '--config=configs/grapheme.py:test', '--workdir', tmp_path)
  flagged = run_module(*args, '--traceback', check=False)
  by_env = run_module(*args, check=False, env={'BENGRAPHEME_TRACEBACK': '1'})
  for result in (flagged, by_env):
    assert result.returncode == 1
    assert 'Traceback (most recent call last)' in result.stderr
    assert 'NoCheckpoint: no checkpoint in' in result.stderr


def tmp_folder_holds(tmp_path, name):
  return any(p.name.startswith('.tmp-') and any(f.name.startswith(name) for f in p.iterdir())
             for p in tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize('moment', ['starting', 'drawing', 'between_shards'])
def test_ctrl_c_while_writing_data_is_one_line_and_leaves_nothing(tmp_path, moment):
  """Ctrl-C reaches the whole process group, pool workers included, as from a terminal:
  while the pool starts (its forkserver and workers still importing), while they draw, and
  while the parent writes a shard and the idle workers wait."""
  out = tmp_path / 'data'
  # A runner started in the background (nohup, `&` without job control) passes Ctrl-C on as
  # ignored, and Python keeps an inherited SIG_IGN: the child gets a terminal's default.
  ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
  if ignored:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # exec makes it SIG_DFL
  proc = subprocess.Popen(
      [sys.executable, '-m', 'bengrapheme.grapheme.synth', '--out', out, '--train', '2000',
       '--test', '0', '--workers', '2'], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  if ignored:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
  deadline = time.time() + 120
  # 'starting' and 'drawing': once the temporary folder holds its tables (the pool starts
  # next); 'between_shards': the moment the first image file appears.
  wanted = 'train_image_data_0' if moment == 'between_shards' else 'train.csv'
  while not tmp_folder_holds(tmp_path, wanted):
    assert proc.poll() is None, proc.communicate()
    assert time.time() < deadline, 'the generator never started writing'
    time.sleep(0.005)
  if moment == 'drawing':
    time.sleep(2)
  os.killpg(proc.pid, signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130, stdout + stderr
  assert 'Traceback' not in stdout + stderr
  assert stderr.strip().splitlines() == [
      f'Interrupted (Ctrl-C) while writing {out}: nothing was left there; rerun to write it.']
  assert 'images in' not in stdout  # no closing progress line that reads like success
  assert list(tmp_path.iterdir()) == []
  if moment == 'between_shards':  # as said: the same command, rerun, writes it
    run_module('bengrapheme.grapheme.synth', '--out', out, '--train', '2000', '--test', '0',
               '--workers', '2')
    assert (out / 'train.csv').exists()



BUSY_COLLECTING = '''
import gc, sys, time
from bengrapheme import errors

def slow_callback(phase, info):  # as jax's own callback, with time for Ctrl-C to land in it
  time.sleep(0.02)

def main():
  gc.callbacks.append(slow_callback)
  print('ready', flush=True)
  with errors.on_ctrl_c('Interrupted (Ctrl-C) while collecting.'):
    end = time.time() + 30
    while time.time() < end:
      gc.collect()
      time.sleep(0.005)

errors.run_reporting(main)
'''


def test_ctrl_c_inside_a_garbage_collector_callback_still_stops_the_program():
  """Python drops a KeyboardInterrupt raised in a gc callback (printing "Exception ignored"
  and a traceback) and runs on: seen once in the data generator, inside jax's callback."""
  ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
  if ignored:  # as above: the child must get a terminal's default
    signal.signal(signal.SIGINT, signal.default_int_handler)
  proc = subprocess.Popen([sys.executable, '-c', BUSY_COLLECTING], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  if ignored:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
  assert proc.stdout.readline() == 'ready\n'
  time.sleep(0.5)
  proc.send_signal(signal.SIGINT)
  _, stderr = proc.communicate(timeout=20)
  assert (proc.returncode, stderr) == (130, 'Interrupted (Ctrl-C) while collecting.\n')


SLOW_STARTING_WORKER = '''
import os, pathlib, sys, time
from bengrapheme import console

class SlowToUnpickle:
  """A worker unpickles its initializer's arguments before any of the pool's code runs."""
  def __reduce__(self):
    return slow_restore, (sys.argv[1],)

def slow_restore(note):
  pathlib.Path(note).write_text(str(os.getpid()))  # now starting: Ctrl-C comes here
  time.sleep(3)
  return None

def keep(_):
  pass

def pid(_):
  return os.getpid()

if __name__ == '__main__':
  with console.worker_pool(1, 'forkserver', keep, (SlowToUnpickle(),)) as pool:
    print(pool.apply(pid, (0,)), flush=True)
'''


def test_a_forkserver_worker_still_starting_ignores_ctrl_c(tmp_path):
  """Ctrl-C reaches every process of the terminal's group, and a pool's worker spends its
  first seconds importing and unpickling its job (on busy cores): it must ignore Ctrl-C from
  its birth, or it prints a KeyboardInterrupt's traceback and dies (seen in the generator's
  forkserver workers; a forked worker is born with the parent's mask, which holds Ctrl-C
  back). The worker here takes 3 s to unpickle and is sent Ctrl-C meanwhile: it serves the
  job, and nothing is printed."""
  script, note = tmp_path / 'pool.py', tmp_path / 'starting'
  script.write_text(SLOW_STARTING_WORKER)
  proc = subprocess.Popen([sys.executable, script, note], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 60
  while not note.exists() or not note.read_text():
    assert proc.poll() is None, proc.communicate()
    assert time.time() < deadline, 'the worker never started'
    time.sleep(0.01)
  worker = int(note.read_text())
  os.kill(worker, signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=60)
  assert (proc.returncode, stderr) == (0, '')
  assert stdout == f'{worker}\n'  # the worker that took Ctrl-C served the job
