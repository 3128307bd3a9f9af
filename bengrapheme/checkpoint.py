"""Orbax checkpoints holding the train state and the grain iterator state in one step.

Saving the iterator beside the parameters is what makes resumption exact: the restored run
reads the very batches the uninterrupted run would have read next.

Orbax writes each step into a temporary folder and renames it when complete, and deletes old
steps only after that, so a crash mid-save leaves the previous good checkpoint in place. A
checkpoint damaged later (a truncated or missing file, garbage) is named, moved aside to
`STEP.damaged` and skipped; restoring falls back to the newest good one. Only damage does
that: any other failure to read a step (a bucket timeout, memory, a sharding error) stops
with its own message and moves nothing, since that step may well be good.

Only the run that owns the workdir (bengrapheme/workdir_lock.py) writes here, so its manager
removes the partial saves that killed runs left. Evaluation and prediction open a read-only
manager: they read beside a training run and change nothing. A save that finds the disk full
stops training with `out_of_space_message`; the steps already saved stay complete.
"""
import contextlib
import json
import os
import re
import shutil
import signal
import zlib

import grain
import jax
import orbax.checkpoint as ocp
import numpy as np
from absl import logging as absl_logging
from etils import epath
from flax import nnx
from jax.experimental import multihost_utils

from bengrapheme import console, errors, files


class ModelMismatchError(errors.UserError, ValueError):
  """The checkpoint was written by a different model or train state layout."""


class NoCheckpoint(errors.UserError, FileNotFoundError):
  """Evaluation or prediction found no checkpoint to read."""


def manager(workdir, *, keep=3, every=None, read_only=False):
  """A manager for `workdir/checkpoints`; saves every `every` steps (and when forced).

  read_only: for readers beside a training run (evaluate, predict), which must neither save,
  delete, nor clean up the trainer's saves in flight.
  """
  # A read-only manager keeps nothing and saves never (Orbax warns when told otherwise).
  options = ocp.CheckpointManagerOptions(
      max_to_keep=None if read_only else keep,
      save_interval_steps=0 if read_only else every or 1, create=not read_only,
      enable_async_checkpointing=True, read_only=read_only,
      cleanup_tmp_directories=not read_only)
  # Handlers registered up front, so that a fresh process can read a step's metadata
  # (to check it against the model) before restoring anything.
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  state_handler = ocp.StandardCheckpointHandler()
  data_handler = grain.checkpoint.CheckpointHandler()
  for args in (ocp.args.StandardSave, ocp.args.StandardRestore):
    registry.add('state', args, state_handler)
  for args in (grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore):
    registry.add('data', args, data_handler)
  # Every item a save writes: Orbax warns at each restore of an item it has no handler for.
  for item in ('log', 'digests'):
    json_handler = ocp.handlers.JsonCheckpointHandler()
    for args in (ocp.args.JsonSave, ocp.args.JsonRestore):
      registry.add(item, args, json_handler)
  if not read_only:
    return ocp.CheckpointManager(directory(workdir), options=options, handler_registry=registry)
  # Orbax warns "Given directory is read only" on every read-only manager: what was asked.
  with _absl_level(absl_logging.ERROR):
    return ocp.CheckpointManager(directory(workdir), options=options, handler_registry=registry)


@contextlib.contextmanager
def _absl_level(level):
  before = absl_logging.get_verbosity()
  absl_logging.set_verbosity(level)
  try:
    yield
  finally:
    absl_logging.set_verbosity(before)


def directory(workdir):
  if '://' in workdir:  # a bucket: Orbax writes it natively
    return f'{workdir.rstrip("/")}/checkpoints'
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


def require(workdir):
  """Raises NoCheckpoint at once (before a model is built) when `workdir` holds no saved
  step, naming a workdir that does not exist as such."""
  if not epath.Path(workdir).exists():
    raise NoCheckpoint(f'--workdir {workdir}: no such folder; expected the workdir of a '
                       'training run (python -m launch.train ... --workdir DIR)')
  if newest_step(workdir) is None:
    raise NoCheckpoint(f'no checkpoint in {directory(workdir)}: train first (python -m '
                       f'launch.train ... --workdir {workdir})')


def newest_step(workdir):
  """The newest complete step in `workdir` (Orbax renames a save to its step when it is
  complete), or None."""
  folder = epath.Path(directory(workdir))
  steps = [int(p.name) for p in folder.glob('*') if p.name.isdigit()] if folder.exists() else []
  return max(steps, default=None)


def save(mngr, step, state, data_iterator=None, force=False, log=None):
  """Saves if `step` is due (or `force`); returns whether a save started. `log`: the
  logger's partial interval (JSON), so that a resumed run logs what an uninterrupted one
  would."""
  if not (force or mngr.should_save(step)):
    return False  # before the checksums, which read the whole state
  items = {'state': ocp.args.StandardSave(state), 'digests': ocp.args.JsonSave(digests(state))}
  if data_iterator is not None:
    items['data'] = grain.checkpoint.CheckpointSave(data_iterator)
  if log is not None:
    items['log'] = ocp.args.JsonSave(log)
  return mngr.save(step, args=ocp.args.Composite(**items), force=force)


def saved_log(mngr, step):
  """The `log` saved with `step`, or None (none saved, or a checkpoint from before logs
  were saved)."""
  if not (mngr.directory / str(step) / 'log').exists():
    return None
  return mngr.restore(step, args=ocp.args.Composite(log=ocp.args.JsonRestore()))['log']


def restore(mngr, abstract_state, data_iterator=None, *, read_only=False):
  """Restores the newest good step into `abstract_state`'s shapes and shardings.

  The iterator, when given, is set to its saved position in place. Damaged steps are
  reported, moved aside (left in place when `read_only`) and skipped; any other error while
  reading a step is raised, leaving every step in place. Returns (step, state), or
  (None, None) when there is no checkpoint. Raises ModelMismatchError when the checkpoint
  holds another model, and RuntimeError when every checkpoint is damaged (starting over would
  silently lose them).
  """
  skip = _report if read_only else _set_aside
  steps = sorted(mngr.all_steps(), reverse=True)
  damaged = []
  for step in steps:
    path = mngr.directory / str(step)
    try:
      saved = _saved_tree(mngr, step, path)
    except Exception as e:  # pylint: disable=broad-except
      damaged.append(skip(mngr, path, _damage_or_raise(path, e)))
      continue
    _check_same_layout(path, saved, abstract_state)
    try:
      restored = mngr.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
      _check_digests(mngr, step, path, restored['state'])
      positions = None if data_iterator is None else _input_positions(path)
    except Exception as e:  # pylint: disable=broad-except
      damaged.append(skip(mngr, path, _damage_or_raise(path, e)))
      continue
    if data_iterator is not None:
      data_iterator.set_state(_one_position(path, positions))
    return step, restored['state']
  if damaged:
    raise RuntimeError(f'every checkpoint in {mngr.directory} is damaged ({", ".join(damaged)})'
                       '; delete them to start over')
  return None, None


# ---------------------------------------------------------------- checksums
# Orbax and TensorStore checksum the index that locates the arrays, not the arrays' values:
# a byte changed inside them restores silently. Each save records, for every array, a CRC32
# of this process's shards (the first replica of each, in shard order) and of where those
# shards lie; a restore onto the same layout recomputes them, and a mismatch is damage.


class ChecksumMismatch(ValueError):
  """A restored array's bytes differ from those its checkpoint saved."""


def _own_crcs(state):
  """([leaf path], uint32 [2, leaves]: CRC32 of this process's shard bytes, and of the shards'
  positions)."""
  paths, values, layouts = [], [], []
  for key, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    shards = sorted((s for s in leaf.addressable_shards if s.replica_id == 0),
                    key=lambda s: str(s.index))
    value = layout = 0
    for shard in shards:
      value = zlib.crc32(np.ascontiguousarray(jax.device_get(shard.data)).tobytes(), value)
      layout = zlib.crc32(str(shard.index).encode(), layout)
    paths.append(jax.tree_util.keystr(key))
    values.append(value)
    layouts.append(layout)
  return paths, np.array([values, layouts], np.uint32)


def digests(state):
  """What a save records of `state` (a collective on a multi-process job): every process's
  CRC32s of its shards' bytes and positions."""
  paths, crcs = _own_crcs(state)
  everyone = np.asarray(multihost_utils.process_allgather(crcs)).reshape(-1, *crcs.shape)
  return dict(arrays=paths, values=everyone[:, 0].tolist(), layouts=everyone[:, 1].tolist())


def _check_digests(mngr, step, path, state):
  """ChecksumMismatch naming the first array of `state` whose bytes differ from the saved
  ones. Only arrays whose shards lie as they did when saved can be checked (each CRC32 covers
  this process's shards in their order); the others are named in one line, not passed over."""
  if not (path / 'digests').exists():
    return  # saved before checkpoints held checksums
  saved = mngr.restore(step, args=ocp.args.Composite(digests=ocp.args.JsonRestore()))['digests']
  paths, (values, layouts) = _own_crcs(state)
  process = jax.process_index()
  if saved['arrays'] != paths or len(saved['values']) != jax.process_count():
    print(f'Checkpoint {path}: saved by {len(saved["values"])} process(es) with '
          f'{len(saved["arrays"])} arrays, restored by {jax.process_count()} with {len(paths)}, '
          'so the CRC32s of its arrays could not be checked.', flush=True)
    return
  other_layout = []
  for name, value, layout, saved_value, saved_layout in zip(
      paths, values, layouts, saved['values'][process], saved['layouts'][process]):
    if layout != saved_layout:
      other_layout.append(name)
    elif value != saved_value:
      raise ChecksumMismatch(f'{path}: array {name} restores with other bytes than were saved '
                             f'(CRC32 {int(value):08x}, saved {int(saved_value):08x})')
  if other_layout:
    print(f'Checkpoint {path}: {len(other_layout)} of {len(paths)} arrays restore onto another '
          f'sharding layout than they were saved with (e.g. {other_layout[0]}), so their CRC32s '
          'could not be checked; the others were.', flush=True)


def _saved_tree(mngr, step, path):
  """The shapes of the train state saved at `step`, read from its metadata."""
  metadata = mngr.item_metadata(step)
  # Orbax reports a missing state folder or _METADATA file as a missing key or None.
  if 'state' not in metadata.keys() or metadata['state'] is None:
    raise FileNotFoundError(f'{path / "state"}: no train state metadata (_METADATA)')
  return metadata['state'].tree


# How TensorStore, which Orbax reads the arrays with, reports stored bytes that are missing,
# cut short or garbled. It raises ValueError('CODE: ...'), and drops the code only for
# INVALID_ARGUMENT, which is what a block that fails to decode gives ('Error reading ...:
# Error decoding b-tree node: ZSTD_decompressStream() failed'). Its other codes
# (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, PERMISSION_DENIED, ...) say that
# reading failed, not that the files are bad.
_TENSORSTORE_DAMAGE = re.compile(
    r'(DATA_LOSS|NOT_FOUND|OUT_OF_RANGE|FAILED_PRECONDITION): |Error (opening|reading|decoding) ')


def _is_damage(error):
  """Whether `error`, raised reading a step, says its files are missing or unreadable."""
  while error.__cause__ is not None:  # Orbax re-raises what went wrong as its cause
    error = error.__cause__
  if isinstance(error, (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError,
                        ChecksumMismatch)):
    return True  # a missing file; metadata or input position that is not JSON; other bytes
  return isinstance(error, ValueError) and bool(_TENSORSTORE_DAMAGE.match(str(error)))


def _damage_or_raise(path, error):
  """Returns `error` when it is damage; raises it otherwise, moving nothing: a step that
  could not be read for another reason (a timeout, memory) may well be good."""
  if _is_damage(error):
    return error
  print(f'Reading checkpoint {path} failed ({type(error).__name__}: {str(error)[:300]}); '
        'not a sign of damage, so every checkpoint is left in place.', flush=True)
  raise error


def _input_positions(path):
  """{file: iterator state} of every process that saved `path`.

  Read here rather than by grain's restore, which opens only the file of this process out of
  this many: a checkpoint could then not move to another process count.
  """
  files = sorted((path / 'data').glob('process_*.json'))
  if not files:
    raise FileNotFoundError(f'{path / "data"}: no process_*.json input position')
  return {f.name: json.loads(f.read_text()) for f in files}


def _one_position(path, positions):
  """The input position, which bengrapheme/input.py keeps alike in every process (it counts
  global batches), so that any process count can resume from it."""
  distinct = {json.dumps(p, sort_keys=True) for p in positions.values()}
  if len(distinct) != 1:
    raise ValueError(f'{path}/data: the processes saved {len(distinct)} different input '
                     f'positions ({", ".join(positions)}); expected one, shared by all')
  return next(iter(positions.values()))


def _report(mngr, path, error):
  """Names a step a reader could not read, leaving it to the run that owns the workdir."""
  del mngr
  if not path.exists():  # the training run deleted it meanwhile (it keeps the newest few)
    print(f'Checkpoint {path} was deleted while being read; trying an older one.', flush=True)
    return f'{path}: deleted while read'
  print(f'Checkpoint {path} is damaged ({type(error).__name__}: {str(error)[:300]}); '
        'skipping it (left in place: only a training run moves it aside).', flush=True)
  return f'{path}: left in place'


def _set_aside(mngr, path, error):
  """Renames a damaged step folder so Orbax never lists it again; returns the new name."""
  target = path.parent / f'{path.name}.damaged'
  print(f'Checkpoint {path} is damaged ({type(error).__name__}: {str(error)[:300]}); '
        f'skipping it and moving it to {target}.', flush=True)
  multihost_utils.sync_global_devices(f'checkpoint damaged {path}')
  if jax.process_index() == 0:
    suffix = 0
    while target.exists():
      suffix += 1
      target = path.parent / f'{path.name}.damaged{suffix}'
    path.rename(target)
  multihost_utils.sync_global_devices(f'checkpoint set aside {path}')
  mngr.reload()
  return f'moved aside to {target}'


def _check_same_layout(path, saved_tree, abstract_state):
  """Raises ModelMismatchError naming the first differences between checkpoint and state."""
  shown = _differences(_shapes(saved_tree), _shapes(abstract_state))
  if shown:
    raise ModelMismatchError(
        f'{path} holds a different model or train state than this config builds ({shown}). '
        'Use a new --workdir, or the config the checkpoint was trained with (the workdir\'s '
        'config.json: launch.evaluate and launch.index read it when --config is left out).')


def _differences(saved, wanted):
  """The first differences between two {name: shape} as one line ('' when none)."""
  problems = [f'{k}: only in the checkpoint' for k in sorted(saved.keys() - wanted.keys())]
  problems += [f'{k}: not in the checkpoint' for k in sorted(wanted.keys() - saved.keys())]
  problems += [f'{k}: shape {saved[k]} in the checkpoint, {wanted[k]} in this config'
               for k in sorted(saved.keys() & wanted.keys()) if saved[k] != wanted[k]]
  return '; '.join(problems[:6]) + (f'; and {len(problems) - 6} more'
                                    if len(problems) > 6 else '')


def _shapes(tree):
  """{'a/b/c': shape} with path parts spelled the same for dicts, attributes and tuples."""
  def name(key):
    for attr in ('key', 'name', 'idx'):
      if hasattr(key, attr):
        return str(getattr(key, attr))
    return str(key)

  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {'/'.join(name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves}


def out_of_space_message(workdir, error):
  """What to tell when `error`, a full disk or quota, stopped training in `workdir`.

  Removes the partial save (Orbax never lists it, but it holds space the rerun needs) and
  names the newest complete step, which the rerun resumes from.
  """
  folder = epath.Path(directory(workdir))
  space = ''
  if not files.is_bucket(workdir):
    if jax.process_index() == 0:
      for partial in folder.glob('*.orbax-checkpoint-tmp*'):
        shutil.rmtree(partial, ignore_errors=True)
    space = f' ({files.space_left(workdir)} once the partial save was removed)'
  newest = newest_step(workdir)
  kept = (f'the newest complete checkpoint, {folder}/{newest}, is intact and restorable'
          if newest is not None else 'no checkpoint had been completed yet')
  return (f'Out of disk space writing to {workdir}{space}: {type(error).__name__}: '
          f'{str(error)[:600]}\nTraining stopped; {kept}. Free space (or keep fewer '
          'checkpoints: --config.train.keep_checkpoints) and rerun the same command to '
          'resume.')


def backbone_state(workdir, backbone):
  """The nnx.State of `backbone`'s variables from the newest checkpoint of another run of this
  project (`model.init_from` naming a workdir, e.g. MaskFeat pre-training's): the subtree
  'backbone' of its parameters and model state. `backbone` may be abstract (nnx.eval_shape).
  Raises ModelMismatchError naming the first differences when that run's backbone is
  another architecture or size."""
  step = newest_step(workdir)
  if step is None:
    raise NoCheckpoint(f'model.init_from={workdir!r}: no checkpoint in {directory(workdir)}')
  mngr = manager(workdir, read_only=True)
  try:
    # No target: the saved arrays as they are (their optimizer state and heads are not ours).
    saved = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore()))['state']
  finally:
    mngr.close()
  found = {**saved.get('model_state', {}).get('backbone', {}),
           **saved['params'].get('backbone', {})}
  wanted = nnx.state(backbone)
  pure = wanted.to_pure_dict()
  # Saved leaves are {'value': array} (a Variable's pytree form); the model's pure dict is not.
  saved_shapes = {k.removesuffix('/value'): v for k, v in _shapes(found).items()}
  shown = _differences(saved_shapes, _shapes(pure))
  if shown:
    raise ModelMismatchError(f'model.init_from={workdir!r}: step {step} holds another backbone '
                             f'than this config builds ({shown}); give model.args as that run '
                             'had them (its config.json)')
  arrays = {k.removesuffix('/value'): np.asarray(v)
            for k, v in zip(_shapes(found), jax.tree.leaves(found))}
  wanted.replace_by_pure_dict(jax.tree.unflatten(jax.tree.structure(pure),
                                                 [arrays[k] for k in _shapes(pure)]))
  return wanted


def abstract(tree):
  """Shapes, dtypes and shardings of `tree`, for restoring without materialising it twice."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class Preemption:
  """Turns a preemption notice (SIGTERM) or Ctrl-C (SIGINT) into "save this step and stop".

  TPU VMs, GCE spot VMs, Kubernetes and SLURM all send SIGTERM before killing a job. In a
  multi-process job JAX's preemption service catches it and agrees with every process on the
  step to save at, so they all save the same step; a single process catches it here. Ctrl-C
  does the same (in a multi-process job by sending this process that SIGTERM); a second
  Ctrl-C raises KeyboardInterrupt at once, losing the steps since the last checkpoint. Used as
  a context manager around the training loop: outside it Ctrl-C interrupts as usual, so
  building prepared data or compiling stops at once.
  """

  def __init__(self):
    self.signal = None  # the name of the first signal received
    self.previous = {}

  def __enter__(self):
    if jax.process_count() == 1:
      self.previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_sigterm)
    self.previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_ctrl_c)
    return self

  def _on_sigterm(self, signum, frame):
    del signum, frame
    self.signal = self.signal or 'SIGTERM'

  def _on_ctrl_c(self, signum, frame):
    del signum, frame
    if self.signal == 'SIGINT':
      raise KeyboardInterrupt
    self.signal = self.signal or 'SIGINT'
    console.say('Ctrl-C: saving the current step, then stopping (Ctrl-C again stops at once, '
                'losing the steps since the last checkpoint).')
    if jax.process_count() > 1:
      os.kill(os.getpid(), signal.SIGTERM)

  @property
  def interrupted(self):
    """Whether Ctrl-C (not a preemption notice) asked to stop."""
    return self.signal == 'SIGINT'

  def reached(self, mngr, step):
    """Whether to save `step` now and stop (call it at every step, on every process)."""
    if jax.process_count() > 1:
      return mngr.reached_preemption(step)
    return self.signal is not None

  def __exit__(self, *exc):
    for signum, handler in self.previous.items():
      signal.signal(signum, handler)
