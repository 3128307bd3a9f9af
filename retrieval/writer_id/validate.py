"""Writer identification's config checks (protocols.Validates)."""
from bengrapheme import errors, models


def validate(config):
  models.require(config)
  errors.require(config, 'data.format', ('folder',))  # writers are read from the file names
  if config.data.val_writers:
    raise errors.ConfigError(f'data.val_writers={config.data.val_writers}: expected 0; '
                             'writer identification holds out pages, not writers')
  if config.model.num_writers < 0:
    raise errors.ConfigError(f'model.num_writers={config.model.num_writers}: expected >= 0 '
                             "(0: one class per writer of train/)")
