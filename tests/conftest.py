"""Shared fixtures: one tiny synthetic Bengali.AI folder per test session, and a CLI runner."""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
  """One persistent JAX compilation cache for the session, this process and every training
  run it starts: about a hundred runs compile the same few test configs, and a cached
  executable is the very one a compile gives (the resume tests compare runs bit for bit
  through it). Fresh each session, so nothing stale carries over; left alone when set."""
  if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    folder = tempfile.mkdtemp(prefix='bengrapheme-test-jax-cache-')
    os.environ['JAX_COMPILATION_CACHE_DIR'] = folder
    os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
# Under CI=true (.ci/run sets it) a test that does not run to its end fails, naming why: a
# skip (a missing browser or root), a skip at collection (a module-level importorskip) or an
# xfail must not let CI pass on fewer tests. The only exceptions are listed here, by node id
# (a module's path for a skip at collection), each with the reason it may not run in CI.
ALLOWED_SKIPS_IN_CI = {}
CI_ADVICE = ('CI runs every test; install what it needs, fix it, or list it in '
             'tests/conftest.py ALLOWED_SKIPS_IN_CI with the reason')


def _fails_in_ci(report, nodeid):
  return (report.skipped and os.environ.get('CI') == 'true' and
          nodeid not in ALLOWED_SKIPS_IN_CI)


def _reason(report):
  return report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  report = (yield).get_result()
  if _fails_in_ci(report, item.nodeid):
    what = (f'xfailed under CI=true ({report.wasxfail or "xfail"})'
            if hasattr(report, 'wasxfail') else f'skipped under CI=true ({_reason(report)})')
    if hasattr(report, 'wasxfail'):
      del report.wasxfail  # pytest counts a failure that was an xfail as no failure
    report.outcome = 'failed'
    report.longrepr = f'{what}: {CI_ADVICE}'


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
  report = (yield).get_result()
  if _fails_in_ci(report, collector.nodeid):
    report.outcome = 'failed'
    report.longrepr = (f'{collector.nodeid} skipped at collection under CI=true '
                       f'({_reason(report)}): {CI_ADVICE}')


CHROMIUM = shutil.which('chromium')
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason='chromium is not installed (Debian package chromium: make '
    'system-packages)')


def screenshot_in_chromium(path, tmp_path, size):
  """RGB uint8 [height, width, 3] of the page at `path` as headless Chromium draws it; fails
  on any console message (the pages have no script: one means an error or a failed load)."""
  screenshot = tmp_path / 'screenshot.png'
  result = subprocess.run(
      [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', f'--user-data-dir={tmp_path}',
       f'--screenshot={screenshot}', f'--window-size={size[0]},{size[1]}',
       '--enable-logging=stderr', '--v=0', f'file://{os.path.abspath(path)}'],
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  console = [line for line in result.stderr.splitlines()
             if ':CONSOLE' in line or 'Uncaught' in line]
  assert not console, console
  image = np.asarray(Image.open(screenshot).convert('RGB'))
  assert image.shape == (size[1], size[0], 3)
  return image


@pytest.fixture(scope='session')
def grapheme_data(tmp_path_factory):
  from bengrapheme.grapheme import synth
  out = tmp_path_factory.mktemp('bengali') / 'data'
  synth.write_dataset(str(out), num_train=96, num_test=24, seed=0, workers=1)
  return str(out)


def run_module(module, *args, devices=1, timeout=600, check=True, env=None, prefix=()):
  """Runs `python -m module args` in a fresh process with `devices` simulated CPU devices;
  `prefix` is a command it runs under (e.g. setpriv)."""
  full_env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu',
                  XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
                  **(env or {}))
  result = subprocess.run([*prefix, sys.executable, '-m', module, *map(str, args)], cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
  if check and result.returncode != 0:
    raise AssertionError(f'{module} {args} exited {result.returncode}:\n'
                         f'{result.stdout[-3000:]}\n{result.stderr[-6000:]}')
  return result


@pytest.fixture(scope='session')
def fragment_data(tmp_path_factory):
  """6 train and 4 test writers, 2 small pages each, cut into HisFrag20-named fragments."""
  from retrieval.synthetic import synth
  out = tmp_path_factory.mktemp('hisfrag') / 'data'
  synth.write_dataset(str(out), writers_train=6, writers_test=4, pages_per_writer=2, seed=0,
                      workers=1, page_size=(500, 700))
  return str(out)


@pytest.fixture(scope='session')
def grapheme_trained(grapheme_data, tmp_path_factory):
  """configs/grapheme.py:test trained for 4 steps on 1 device, logging every step, with a
  profiler trace of steps 2-3."""
  workdir = str(tmp_path_factory.mktemp('grapheme_run') / 'workdir')
  run_module('launch.train', '--config=configs/grapheme.py:test', '--data', grapheme_data,
             '--workdir', workdir, '--config.train.steps=4', '--config.train.log_every=1',
             '--config.train.profile_steps=(2, 3)')
  return workdir


@pytest.fixture(scope='session')
def grapheme_evaluated(grapheme_data, grapheme_trained):
  """grapheme_trained after launch.evaluate (eval/metrics.json, eval/report.html)."""
  run_module('launch.evaluate', '--config=configs/grapheme.py:test', '--data', grapheme_data,
             '--workdir', grapheme_trained)
  return grapheme_trained


def trained_and_evaluated(config, data, workdir):
  """`workdir` (a str) after launch.train then launch.evaluate of `config` on `data`."""
  args = [f'--config={config}', '--data', data, '--workdir', workdir]
  run_module('launch.train', *args)
  run_module('launch.evaluate', *args)
  return workdir


@pytest.fixture(scope='session')
def fragment_evaluated(fragment_data, tmp_path_factory):
  """configs/fragments.py:test trained (6 steps), then evaluated by launch.evaluate."""
  return trained_and_evaluated('configs/fragments.py:test', fragment_data,
                               str(tmp_path_factory.mktemp('fragment_run') / 'workdir'))


@pytest.fixture
def small_disk(tmp_path):
  """mount(size) mounts a tmpfs of `size` (e.g. '8m') at tmp_path/disk, or resizes it, and
  returns the folder (a pathlib.Path); unmounted at the end. Needs root (CI runs as root)."""
  if os.geteuid() != 0:
    pytest.skip('mounting a small filesystem needs root (CI runs the tests as root)')
  disk = pathlib.Path(tmp_path) / 'disk'
  disk.mkdir()

  def mount(size):
    options = f'remount,size={size}' if os.path.ismount(disk) else f'size={size}'
    subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', str(disk)], check=True)
    return disk

  yield mount
  if os.path.ismount(disk):
    subprocess.run(['umount', str(disk)], check=True)
