"""Flags shared by the train / evaluate / predict CLIs.

Bad flags stop the run at parsing, before any work, with one line naming the flag and what
was expected: a mistyped config key lists the valid keys at its level, and a workdir that
cannot be written says so.
"""
import os
import sys

from absl import flags
from ml_collections import config_dict, config_flags

from bengrapheme import schema

CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file and variant, e.g. configs/grapheme.py:demo; any field can '
    'be overridden: --config.train.steps=200. launch.evaluate and launch.index default to '
    "the config the workdir's training run recorded (WORKDIR/config.json)", lock_config=True)
WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, logs and outputs go here.')
DATA = flags.DEFINE_string('data', None, 'Dataset folder (sets config.data.dir).')


def unknown_key_message(config, override):
  """Why `override` (e.g. 'train.stepz') names no field of `config`, or None if it does."""
  node, path = config, 'config'
  for key in override.split('.'):
    key = key.split('[', 1)[0]  # 'size[0]' indexes the field 'size'
    if not isinstance(node, config_dict.ConfigDict):
      return f'{path} holds a {type(node).__name__} value, not fields; no field {key!r}'
    if key not in node:
      valid = sorted(node.keys())
      return (f'{path} has no field {key!r}{schema.close_to(key, valid)}; valid fields: '
              f'{", ".join(valid)}')
    node, path = node[key], f'{path}.{key}'
  return None


def _report_unknown_keys(config_flag):
  """Wraps the config flag's parsing so a mistyped override key is a flags error.

  ml_collections raises a bare AttributeError / KeyError (a traceback that names neither the
  flag nor the valid keys); absl prints a flags error as one line and exits.
  """
  parse = config_flag._parse

  def checked(argument):
    try:
      return parse(argument)
    except (AttributeError, KeyError):
      config = config_flag.parser.parse(argument)
      for arg in sys.argv[1:]:
        name = arg.split('=', 1)[0].lstrip('-')
        if name.startswith(f'{config_flag.name}.'):
          message = unknown_key_message(config, name.split('.', 1)[1])
          if message:
            raise flags.IllegalFlagValueError(f'--{name}: {message}') from None
      raise

  config_flag._parse = checked


def _workdir_is_given(path):
  """Every run writes its workdir but launch.train's checks (--dry_run, --feed_check), which
  write nothing."""
  if path is None and not any(flags.FLAGS.get_flag_value(check, False)
                              for check in ('dry_run', 'feed_check')):
    raise flags.ValidationError('--workdir is required: checkpoints, logs and outputs go '
                                'there')
  return True


def _workdir_is_writable(path):
  """Outputs go to the workdir: refuse one that cannot be written before any work starts."""
  if path is None or '://' in path:
    return True  # _workdir_is_given reports a missing one; buckets are checked on use
  existing = os.path.abspath(path)
  while not os.path.exists(existing):  # the folders to be created go in the nearest existing one
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise flags.ValidationError(f'{existing} is a file; expected a folder to write '
                                'checkpoints and outputs into')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise flags.ValidationError(f'{existing} is not writable by this user; expected a '
                                'folder to write checkpoints and outputs into')
  return True


def _data_is_a_folder(path):
  """A mistyped --data is named at once, before any work and before the workdir is made."""
  if path is None or '://' in path:
    return True
  if not os.path.exists(path):
    raise flags.ValidationError('no such folder; expected the dataset folder')
  if not os.path.isdir(path):
    raise flags.ValidationError('a file; expected the dataset folder')
  return True


_report_unknown_keys(flags.FLAGS[CONFIG.name])
flags.register_validator('data', _data_is_a_folder)
flags.register_validator('workdir', _workdir_is_given)
flags.register_validator('workdir', _workdir_is_writable)


def config(from_workdir=False):
  """The config with --data applied; initialises jax.distributed first when asked to. With
  `from_workdir` and no --config, the one WORKDIR/config.json records (the config its
  checkpoints were trained with)."""
  from absl import logging
  from bengrapheme import console, errors, parallel
  logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO
  parallel.initialize_distributed()
  from bengrapheme import train
  c = CONFIG.value
  if c is None:
    workdir = WORKDIR.value
    if not from_workdir:
      raise errors.UserError('flag --config: give the config file and variant, e.g. '
                             '--config configs/grapheme.py:demo')
    c = train.read_config(workdir)
    if c is None:
      raise errors.UserError(f'{workdir} has no config.json (its training run writes one): '
                             'give the config, e.g. --config configs/fragments.py:demo')
    console.say(f'Using the config the checkpoints were trained with: '
                f'{os.path.join(workdir, "config.json")}')
  if DATA.value:
    c.data.dir = DATA.value
  train.load_task(c)  # its validate: a bad value is one line before any work
  return c
