"""The console commands pyproject.toml installs: bengrapheme-train, -evaluate, -predict,
-index, -search, -serve.

They run launch.train / .evaluate / .predict / .index / .search (`python -m launch.predict`
works as well). Unlike `python -m`, they also read `--config configs/NAME.py:VARIANT` (or
NAME.py:VARIANT) from the installed `configs` package when no such file is under the current
directory, so an installed project runs from anywhere (a Kaggle notebook's /kaggle/working).
"""
import importlib
import importlib.util
import os
import sys


def packaged_config(value, cwd=None):
  """`value` of --config, pointed at the installed `configs` package when it names
  configs/NAME.py (or NAME.py) and no such file exists under `cwd`; else `value` unchanged."""
  path, sep, variant = value.partition(':')
  if os.path.exists(os.path.join(cwd or os.getcwd(), path)):
    return value
  folder, name = os.path.split(os.path.normpath(path))
  spec = importlib.util.find_spec('configs')
  if folder not in ('', 'configs') or spec is None or not spec.submodule_search_locations:
    return value
  for location in spec.submodule_search_locations:
    candidate = os.path.join(location, name)
    if os.path.isfile(candidate):
      return candidate + sep + variant
  return value


def resolve_config_args(argv, cwd=None):
  """argv with each --config value (--config=V, --config V, -config ...) run through
  packaged_config; the --config.FIELD=... overrides are left alone."""
  out, i = list(argv), 1
  while i < len(out):
    arg = out[i]
    if arg == '--':
      break
    name, eq, value = arg.partition('=')
    if name in ('--config', '-config'):
      if eq:
        out[i] = f'{name}={packaged_config(value, cwd)}'
      elif i + 1 < len(out):
        out[i + 1] = packaged_config(out[i + 1], cwd)
        i += 1
    i += 1
  return out


def _run(module_name):
  from launch import cli
  sys.argv = resolve_config_args(sys.argv)
  module = importlib.import_module(module_name)
  sys.modules['__main__'].__doc__ = module.__doc__  # what --help prints, as under python -m
  cli.run(module.main)


def train_main():
  _run('launch.train')


def evaluate_main():
  _run('launch.evaluate')


def predict_main():
  _run('launch.predict')


def index_main():
  _run('launch.index')


def search_main():
  _run('launch.search')


def serve_main():
  _run('launch.serve')
