"""Backbones, one file each, looked up by config string: `config.model.name = 'resnet'`."""
import importlib
import importlib.util
import pkgutil

from bengrapheme import errors


def require(config):
  """errors.ConfigError unless config.model.name names a module here (a task's validate)."""
  name = config.model.name
  if importlib.util.find_spec(f'bengrapheme.models.{name}') is None:
    available = sorted(m.name for m in pkgutil.iter_modules(__path__)
                       if m.name != 'pytorch_weights')
    raise errors.ConfigError(f'model.name={name!r}: expected one of {", ".join(available)} '
                             '(bengrapheme/models/NAME.py)')


def backbone(name, **kwargs):
  try:
    module = importlib.import_module(f'bengrapheme.models.{name}')
  except ModuleNotFoundError as e:
    raise ValueError(f'model.name={name!r}: no module bengrapheme/models/{name}.py') from e
  return module.Model(**kwargs)
