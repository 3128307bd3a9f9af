"""Backbones, one file each, looked up by config string: `config.model.name = 'resnet'`."""
import importlib


def backbone(name, **kwargs):
  try:
    module = importlib.import_module(f'bengrapheme.models.{name}')
  except ModuleNotFoundError as e:
    raise ValueError(f'model.name={name!r}: no module bengrapheme/models/{name}.py') from e
  return module.Model(**kwargs)
