"""Flags shared by the train / evaluate / predict CLIs."""
from absl import flags
from ml_collections import config_flags

CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file and variant, e.g. configs/grapheme.py:demo; any field can '
    'be overridden: --config.train.steps=200', lock_config=True)
WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, logs and outputs go here.')
DATA = flags.DEFINE_string('data', None, 'Dataset folder (sets config.data.dir).')
flags.mark_flags_as_required(['config', 'workdir'])


def config():
  """The config with --data applied; initialises jax.distributed first when asked to."""
  from absl import logging
  from bengrapheme import parallel
  logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO
  parallel.initialize_distributed()
  c = CONFIG.value
  if DATA.value:
    c.data.dir = DATA.value
  return c
