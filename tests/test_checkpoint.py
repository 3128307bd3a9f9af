"""Checkpoints hold the train state and the input position together."""
import jax
import jax.numpy as jnp
import numpy as np

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
