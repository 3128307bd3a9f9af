"""The grapheme task's config checks (protocols.Validates): run by train.load_task, so by every
entry point before any data work, each naming the field's path and what it allows."""
from bengrapheme import errors, models
from bengrapheme.grapheme import losses


def validate(config):
  models.require(config)
  losses.check_loss(config)
  errors.require(config, 'data.format', ('kaggle', 'tfds'))
  if config.data.format == 'tfds' and not config.data.tfds_dir:
    raise errors.ConfigError("data.format='tfds' needs data.tfds_dir, a TFDS data dir holding "
                             'a bengaliai build')
  for path in ('unseen.never_rendered', 'unseen.val_graphemes', 'render.fraction'):
    if not 0 <= errors.field(config, path) < 1:
      raise errors.ConfigError(f'{path}={errors.field(config, path)!r}: expected a share in '
                               '[0, 1)')
  if config.render.fraction and config.render.images < 1:
    raise errors.ConfigError(f'render.images={config.render.images!r}: expected >= 1 for '
                             f'render.fraction={config.render.fraction}')
  errors.require(config, 'predict.read', ('stream', 'prepared'))
  if config.predict.window_rows < 0:
    raise errors.ConfigError(f'predict.window_rows={config.predict.window_rows!r}: expected '
                             '>= 0 (0: a whole file at a time)')
