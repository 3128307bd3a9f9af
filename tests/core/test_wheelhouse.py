"""The installable project and its offline wheelhouse (launch/wheelhouse.py, pyproject.toml).

The slow test is the Kaggle notebook path end to end: build the wheelhouse, install it with
no index into a fresh venv, and run the installed bengrapheme-predict from outside the
checkout on a read-only Kaggle-layout folder (no test_labels.csv, as on Kaggle).
"""
import csv
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import tomllib
import zipfile

import pytest

from conftest import ROOT
from launch import commands, wheelhouse


def _pins(lines):
  return [line.split('#', 1)[0].strip() for line in lines if line.split('#', 1)[0].strip()]


def test_dependencies_are_requirements_txt_minus_its_test_section():
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    project = tomllib.load(f)['project']
  with open(os.path.join(ROOT, 'requirements.txt')) as f:
    lines = f.read().splitlines()
  tests_at = lines.index('# tests')  # everything below it is test-only
  runtime, test_only = _pins(lines[:tests_at]), _pins(lines[tests_at + 1:])
  assert project['dependencies'] == runtime, (
      'pyproject.toml [project].dependencies must list requirements.txt above "# tests", '
      'in order')
  # What the tests alone need is imported by no installed module.
  names = [re.split(r'[=<>~!\[ ]', pin, maxsplit=1)[0] for pin in test_only]
  assert names == ['pytest', 'pandas', 'playwright']
  imports = re.compile(r'^\s*(import|from)\s+(pytest|pandas|playwright)\b', re.M)
  for package in ('bengrapheme', 'retrieval', 'launch', 'configs'):
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith('.py'):
          with open(os.path.join(folder, name)) as f:
            assert not imports.search(f.read()), os.path.join(folder, name)


def test_config_path_resolves_in_the_installed_configs_package(tmp_path):
  configs = os.path.join(ROOT, 'configs')  # the `configs` package this interpreter imports
  outside = str(tmp_path)
  argv = ['bengrapheme-predict', '--config', 'configs/grapheme.py:kaggle', '--data', 'D',
          '--config=grapheme.py:test', '-config', 'configs/fragments.py',
          '--config.train.steps=3', '--config=configs/nope.py:x', '--config=elsewhere/grapheme.py']
  assert commands.resolve_config_args(argv, cwd=outside) == [
      'bengrapheme-predict', '--config', f'{configs}/grapheme.py:kaggle', '--data', 'D',
      f'--config={configs}/grapheme.py:test', '-config', f'{configs}/fragments.py',
      '--config.train.steps=3', '--config=configs/nope.py:x', '--config=elsewhere/grapheme.py']
  # A file that exists where the command runs is used as given.
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'grapheme.py').write_text('')
  assert commands.packaged_config('configs/grapheme.py:test', cwd=outside) == \
      'configs/grapheme.py:test'


def test_platform_tags_include_the_older_manylinux_ones():
  tags = wheelhouse.expand_platforms(['manylinux_2_28_x86_64'])
  assert tags[0] == 'manylinux_2_28_x86_64' and 'manylinux_2_27_x86_64' in tags
  assert tags[-3:] == ['manylinux2014_x86_64', 'manylinux2010_x86_64', 'manylinux1_x86_64']
  assert wheelhouse.expand_platforms(['manylinux2014_x86_64'])[0] == 'manylinux_2_17_x86_64'
  assert wheelhouse.expand_platforms(['win_amd64']) == ['win_amd64']


def test_refuses_to_replace_a_folder_it_did_not_write(tmp_path):
  (tmp_path / 'notes.txt').write_text('mine')
  with pytest.raises(wheelhouse.WheelhouseError, match='not a wheelhouse this command wrote'):
    wheelhouse.build(str(tmp_path))
  assert (tmp_path / 'notes.txt').read_text() == 'mine'


def _timed(what, times, *cmd, **kwargs):
  start = time.monotonic()
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
  times[what] = round(time.monotonic() - start, 1)
  assert result.returncode == 0, (f'{what}: {cmd} exited {result.returncode}:\n'
                                  f'{result.stdout[-3000:]}\n{result.stderr[-5000:]}')
  return result


@pytest.fixture(scope='module')
def times():
  measured = {}
  yield measured
  print('\ntest_wheelhouse seconds:', measured)


@pytest.fixture(scope='module')
def wheelhouse_dir(tmp_path_factory, times):
  out = str(tmp_path_factory.mktemp('wheelhouse') / 'wheelhouse')
  result = _timed('wheelhouse', times, sys.executable, '-m', 'launch.wheelhouse', '--out', out,
                  cwd=ROOT)
  assert f'pip install --no-index --find-links {out} bengrapheme' in result.stdout
  return out


@pytest.fixture(scope='module')
def installed(wheelhouse_dir, tmp_path_factory, times):
  """A fresh venv (no system site packages) with the wheelhouse installed offline."""
  venv = str(tmp_path_factory.mktemp('kaggle') / 'venv')
  _timed('venv', times, sys.executable, '-m', 'venv', venv)
  # --no-compile: the .pyc files are written on first import instead (halves the install).
  _timed('install', times, os.path.join(venv, 'bin', 'python'), '-m', 'pip', 'install', '-q',
         '--disable-pip-version-check', '--no-compile', '--no-index', '--find-links',
         wheelhouse_dir, 'bengrapheme')
  return venv


def _read_only(folder):
  for path, dirs, files in os.walk(folder):
    for name in files:
      os.chmod(os.path.join(path, name), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
  for path, dirs, files in os.walk(folder, topdown=False):
    os.chmod(path, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)


@pytest.mark.slow
def test_offline_install_predicts_from_outside_the_checkout(
    installed, wheelhouse_dir, grapheme_data, grapheme_trained, tmp_path, times):
  listed = open(os.path.join(wheelhouse_dir, 'requirements.txt')).read()
  assert 'bengrapheme==0.1.0\n' in listed and 'jax==0.10.2\n' in listed
  project_wheel, = [n for n in os.listdir(wheelhouse_dir) if n.startswith('bengrapheme-')]
  with zipfile.ZipFile(os.path.join(wheelhouse_dir, project_wheel)) as z:
    names = set(z.namelist())
  assert {'bengrapheme/grapheme/graphemes.csv', 'bengrapheme/models/resnet.py',
          'retrieval/fragments/task.py', 'launch/predict.py', 'configs/grapheme.py'} <= names
  assert not any(n.startswith(('tests/', 'bench/')) for n in names)

  # The competition folder as Kaggle mounts it: read-only, no test answers.
  data = tmp_path / 'input' / 'bengaliai-cv19'
  shutil.copytree(grapheme_data, data, ignore=shutil.ignore_patterns('test_labels.csv'))
  _read_only(tmp_path / 'input')
  # The trained run as the notebook copies it into /kaggle/working: the newest checkpoint,
  # config.json and class_counts.json (docs/kaggle-notebook.md).
  workdir = tmp_path / 'working' / 'run'
  steps = sorted(int(n) for n in os.listdir(os.path.join(grapheme_trained, 'checkpoints'))
                 if n.isdigit())
  shutil.copytree(os.path.join(grapheme_trained, 'checkpoints', str(steps[-1])),
                  workdir / 'checkpoints' / str(steps[-1]))
  for name in ('config.json', 'class_counts.json'):
    shutil.copy(os.path.join(grapheme_trained, name), workdir / name)

  bin_dir = os.path.join(installed, 'bin')
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  env.update(JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=1')
  outside = str(tmp_path / 'working')
  where = _timed('import', times, os.path.join(bin_dir, 'python'), '-c',
                 'import bengrapheme, configs, launch, retrieval; '
                 'print(bengrapheme.__file__, configs.__file__, launch.__file__, '
                 'retrieval.__file__)', cwd=outside, env=env).stdout.split()
  assert all(p.startswith(installed) for p in where), where
  try:
    result = _timed('predict', times, os.path.join(bin_dir, 'bengrapheme-predict'),
                    '--config', 'configs/grapheme.py:test', '--data', str(data),
                    '--workdir', str(workdir),
                    f'--config.data.cache_dir={tmp_path / "temp" / "prepared"}',
                    cwd=outside, env=env)
  finally:
    os.chmod(tmp_path / 'input', stat.S_IRWXU)  # so that pytest can clean up
    for path, dirs, _ in os.walk(tmp_path / 'input'):
      for name in dirs:
        os.chmod(os.path.join(path, name), stat.S_IRWXU)
  submission = workdir / 'submission.csv'
  assert str(submission) in result.stdout
  with open(submission) as f:
    rows = list(csv.reader(f))
  with open(data / 'test.csv') as f:
    test_rows = list(csv.DictReader(f))
  assert rows[0] == ['row_id', 'target']
  assert [r[0] for r in rows[1:]] == [r['row_id'] for r in test_rows]
  assert all(r[1].isdigit() for r in rows[1:])
  assert not os.path.exists(workdir / 'prepared')  # it went to cache_dir
