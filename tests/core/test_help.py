"""--help of every entry point: the project's own flags, one line each, exit 0."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_module

FLAGS = {'launch.train': ('config', 'workdir', 'data', 'dry_run', 'dry_run_devices',
                          'feed_check', 'feed_check_seconds', 'compile_cache', 'traceback'),
         'launch.evaluate': ('config', 'workdir', 'data', 'evals', 'compile_cache', 'traceback'),
         'launch.predict': ('config', 'workdir', 'data', 'compile_cache', 'traceback'),
         'launch.sweep': ('config', 'workdir', 'data', 'sweep', 'trials', 'storage',
                          'report_test', 'compile_cache', 'traceback'),
         'launch.score_distances': ('distances', 'data', 'out', 'compile_cache', 'traceback'),
         'launch.index': ('config', 'workdir', 'data', 'collection', 'manifest', 'iiif_size',
                          'index', 'compile_cache', 'traceback'),
         'launch.search': ('workdir', 'index', 'query', 'query-collection', 'top', 'out',
                           'compile_cache', 'traceback'),
         'launch.serve': ('workdir', 'index', 'db', 'host', 'port', 'round', 'candidates',
                          'max_upload_mb', 'compile_cache', 'traceback')}


def listed_flags(stdout):
  lines = stdout.splitlines()
  return [line.split(':', 1)[0].strip() for line in lines[lines.index('Flags:') + 1:]]


@pytest.mark.parametrize('module', sorted(FLAGS))
@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_help_lists_the_own_flags_and_exits_0(module, flag):
  result = run_module(module, flag, timeout=120)  # raises unless it exits 0
  assert listed_flags(result.stdout) == [f'--{f}' for f in (*FLAGS[module], 'helpfull')]
  assert 'python -m ' + module in result.stdout  # the module's usage comes first
  assert result.stderr == ''


def test_installed_command_lists_the_same_flags(tmp_path):
  code = ('import sys; sys.argv = ["bengrapheme-train", "--help"]; '
          'from launch import commands; commands.train_main()')
  installed = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True,
                             text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert installed.returncode == 0, installed.stderr
  assert listed_flags(installed.stdout) == [f'--{f}' for f in (*FLAGS['launch.train'],
                                                                'helpfull')]


def test_help_into_a_closed_pipe_is_quiet():
  """`--help | head -1`: the reader leaves early; no BrokenPipeError traceback, exit 0."""
  read, write = os.pipe()
  os.close(read)  # every write fails as if `head` had already left
  with os.fdopen(write, 'wb') as stdout:
    result = subprocess.run([sys.executable, '-m', 'launch.train', '--help'], cwd=ROOT,
                            stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=ROOT))
  assert (result.returncode, result.stderr) == (0, '')
