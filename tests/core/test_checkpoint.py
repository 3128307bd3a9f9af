"""Checkpoints hold the train state and the input position together."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bengrapheme import checkpoint, input as input_lib


class ArraySource:

  def __init__(self, n):
    self.images = np.arange(n * 6, dtype=np.uint8).reshape(n, 2, 3)

  def __len__(self):
    return len(self.images)

  def __getitem__(self, i):
    return {'image': self.images[i], 'index': np.int32(i)}


def make_iterator():
  return iter(input_lib.train_dataset(ArraySource(37), batch_size=4, seed=3, process_index=0,
                                      process_count=1, num_threads=2))


def test_restore_resumes_state_and_batches_exactly(tmp_path):
  state = {'step': jnp.int32(3), 'params': {'w': jnp.arange(6.0).reshape(2, 3)}}
  data = make_iterator()
  for _ in range(12):  # past the first epoch of 9 batches: the reshuffled second epoch
    next(data)
  mngr = checkpoint.manager(str(tmp_path), keep=2)
  checkpoint.save(mngr, 3, state, data, force=True)
  mngr.wait_until_finished()
  expected = [next(data) for _ in range(5)]

  fresh = make_iterator()
  mngr = checkpoint.manager(str(tmp_path), keep=2)
  step, restored = checkpoint.restore(mngr, checkpoint.abstract(state), fresh)
  assert step == 3
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  for want in expected:
    got = next(fresh)
    np.testing.assert_array_equal(got['index'], want['index'])
    np.testing.assert_array_equal(got['image'], want['image'])


def test_epochs_are_reshuffled_and_cover_every_example():
  data = make_iterator()
  # The stream runs across epoch boundaries: no example is dropped by batching.
  stream = np.concatenate([next(data)['index'] for _ in range(37)])  # 4 epochs of 37
  epochs = stream.reshape(4, 37)
  for epoch in epochs:
    np.testing.assert_array_equal(np.sort(epoch), np.arange(37))
  assert not np.array_equal(epochs[0], epochs[1])


def test_processes_read_disjoint_slices():
  def indices(p):
    data = iter(input_lib.train_dataset(ArraySource(40), batch_size=4, seed=3,
                                        process_index=p, process_count=2, num_threads=2))
    return np.concatenate([next(data)['index'] for _ in range(5)])

  a, b = indices(0), indices(1)
  assert not set(a) & set(b) and len(set(a) | set(b)) == 40


def test_eval_batches_cover_each_example_once_with_equal_batch_counts():
  source = ArraySource(5)
  per_process = [list(input_lib.eval_batches(source, batch_size=1, process_index=p,
                                             process_count=4, num_threads=1))
                 for p in range(4)]
  # Process 0 holds 2 examples, the others 1: they send an all-padding second batch, so no
  # process waits on a collective the others never join.
  assert {len(batches) for batches in per_process} == {2}
  assert not per_process[3][1]['mask'].any()
  seen = np.concatenate([b['index'][b['mask']] for batches in per_process for b in batches])
  np.testing.assert_array_equal(np.sort(seen), np.arange(5))


def _saved(tmp_path, steps=(2, 4, 6)):
  state = {'step': jnp.int32(0), 'params': {'w': jnp.arange(6.0).reshape(2, 3)}}
  mngr = checkpoint.manager(str(tmp_path), keep=5)
  for s in steps:
    checkpoint.save(mngr, s, dict(state, step=jnp.int32(s)), force=True)
  mngr.wait_until_finished()
  return state, mngr, os.path.join(str(tmp_path), 'checkpoints')


def _truncate_arrays(step_dir):
  for root, _, files in os.walk(os.path.join(step_dir, 'state')):
    for name in files:
      path = os.path.join(root, name)
      if os.sep + 'd' + os.sep in path:
        with open(path, 'r+b') as f:
          f.truncate(os.path.getsize(path) // 2)


def _garbage_metadata(step_dir):
  with open(os.path.join(step_dir, 'state', '_METADATA'), 'wb') as f:
    f.write(os.urandom(300))


def _missing_manifest(step_dir):
  os.remove(os.path.join(step_dir, 'state', 'manifest.ocdbt'))


@pytest.mark.parametrize('damage', [_truncate_arrays, _garbage_metadata, _missing_manifest])
def test_damaged_newest_checkpoint_is_named_and_skipped(tmp_path, capsys, damage):
  state, mngr, root = _saved(tmp_path)
  damage(os.path.join(root, '6'))
  mngr = checkpoint.manager(str(tmp_path), keep=5)
  step, restored = checkpoint.restore(mngr, checkpoint.abstract(state))
  assert step == 4 and int(restored['step']) == 4
  out = capsys.readouterr().out
  assert f'Checkpoint {os.path.join(root, "6")} is damaged' in out
  assert sorted(os.listdir(root)) == ['2', '4', '6.damaged']
  # The step can be saved again once training gets back to it.
  checkpoint.save(mngr, 6, dict(state, step=jnp.int32(6)), force=True)
  mngr.wait_until_finished()
  assert checkpoint.restore(mngr, checkpoint.abstract(state))[0] == 6


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(tmp_path):
  state, mngr, root = _saved(tmp_path, steps=(2, 4))
  for s in ('2', '4'):
    _garbage_metadata(os.path.join(root, s))
  mngr = checkpoint.manager(str(tmp_path), keep=5)
  with pytest.raises(RuntimeError, match='every checkpoint in .* is damaged'):
    checkpoint.restore(mngr, checkpoint.abstract(state))


def test_unfinished_save_leaves_the_previous_checkpoint(tmp_path):
  """A save cut off by a crash exists only under Orbax's temporary name: never restored."""
  state, mngr, root = _saved(tmp_path, steps=(2,))
  partial = os.path.join(root, '4.orbax-checkpoint-tmp-1764000000')
  os.makedirs(os.path.join(partial, 'state'))
  with open(os.path.join(partial, 'state', '_METADATA'), 'w') as f:
    f.write('{"cut off')
  mngr = checkpoint.manager(str(tmp_path), keep=1)
  step, restored = checkpoint.restore(mngr, checkpoint.abstract(state))
  assert step == 2 and int(restored['step']) == 2


def test_checkpoint_of_another_model_is_refused_by_name(tmp_path):
  state, mngr, root = _saved(tmp_path, steps=(2,))
  other = {'step': jnp.int32(0), 'params': {'w': jnp.zeros((4, 3)), 'b': jnp.zeros(3)}}
  with pytest.raises(checkpoint.ModelMismatchError,
                     match=r"params/b: not in the checkpoint; params/w: shape \(2, 3\) in the "
                           r"checkpoint, \(4, 3\) in this config"):
    checkpoint.restore(mngr, checkpoint.abstract(other))
  assert sorted(os.listdir(root)) == ['2']  # a good checkpoint is never moved aside
