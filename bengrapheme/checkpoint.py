"""Orbax checkpoints holding the train state and the grain iterator state in one step.

Saving the iterator beside the parameters is what makes resumption exact: the restored run
reads the very batches the uninterrupted run would have read next.
"""
import os

import grain
import jax
import orbax.checkpoint as ocp


def manager(workdir, *, keep=3, every=None):
  """A manager for `workdir/checkpoints`; saves every `every` steps (and when forced)."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, save_interval_steps=every or 1, create=True,
      enable_async_checkpointing=True)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), 'checkpoints'),
                               options=options, item_names=('state', 'data'))


def save(mngr, step, state, data_iterator=None, force=False):
  """Saves if `step` is due (or `force`); returns whether a save started."""
  items = {'state': ocp.args.StandardSave(state)}
  if data_iterator is not None:
    items['data'] = grain.checkpoint.CheckpointSave(data_iterator)
  return mngr.save(step, args=ocp.args.Composite(**items), force=force)


def restore(mngr, abstract_state, data_iterator=None, step=None):
  """Restores `step` (default: newest) into `abstract_state`'s shapes and shardings.

  The iterator, when given, is set to its saved position in place. Returns (step, state),
  or (None, None) when there is no checkpoint.
  """
  step = mngr.latest_step() if step is None else step
  if step is None:
    return None, None
  items = {'state': ocp.args.StandardRestore(abstract_state)}
  if data_iterator is not None:
    items['data'] = grain.checkpoint.CheckpointRestore(data_iterator)
  restored = mngr.restore(step, args=ocp.args.Composite(**items))
  return step, restored['state']


def abstract(tree):
  """Shapes, dtypes and shardings of `tree`, for restoring without materialising it twice."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
