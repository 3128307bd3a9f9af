"""Checkpoints hold the train state and the input position together."""
import os
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bengrapheme import checkpoint, input as input_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
  # 'big' is large enough for TensorStore to store it in a data file of its own, which only
  # restoring reads (small arrays sit inside the b-tree that the metadata is read from);
  # random bits, which zstd cannot compress, so its raw bytes lie in that file as they are.
  big = np.random.default_rng(0).integers(0, 2**32, (64, 64), dtype=np.uint32)
  state = {'step': jnp.int32(0), 'params': {'w': jnp.arange(6.0).reshape(2, 3),
                                            'big': jnp.asarray(big)}}
  mngr = checkpoint.manager(str(tmp_path), keep=5)
  data = make_iterator()
  for s in steps:
    checkpoint.save(mngr, s, dict(state, step=jnp.int32(s)), data, force=True)
  mngr.wait_until_finished()
  return state, mngr, os.path.join(str(tmp_path), 'checkpoints')


def test_a_restore_reads_every_saved_item_without_a_warning(tmp_path, caplog):
  """Every item a save writes has a handler when a fresh process restores: Orbax otherwise
  warns on each restore that an item "could not be restored", which reads as damage."""
  state = {'step': jnp.int32(3), 'params': {'w': jnp.arange(6.0).reshape(2, 3)}}
  mngr = checkpoint.manager(str(tmp_path))
  checkpoint.save(mngr, 3, state, make_iterator(), force=True, log={'loss': 1.0})
  mngr.wait_until_finished()
  caplog.set_level('WARNING')
  mngr = checkpoint.manager(str(tmp_path))
  assert checkpoint.restore(mngr, checkpoint.abstract(state), make_iterator())[0] == 3
  assert checkpoint.saved_log(mngr, 3) == {'loss': 1.0}
  assert not [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']


def _files(step_dir, folder):
  return [os.path.join(root, name) for root, _, names in os.walk(os.path.join(step_dir, folder))
          for name in names]


def _truncate_arrays(step_dir):
  for path in _files(step_dir, 'state'):
    if os.sep + 'd' + os.sep in path:
      with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)


def _truncate_array_data(step_dir):
  """Only the data file of 'big': the metadata reads fine, restoring it fails."""
  path = max(_files(step_dir, os.path.join('state', 'ocdbt.process_0', 'd')),
             key=os.path.getsize)
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


def _flip_btree_byte(offset):
  def damage(step_dir):
    [path] = _files(step_dir, os.path.join('state', 'd'))
    with open(path, 'r+b') as f:
      f.seek(offset)
      byte = f.read(1)[0]
      f.seek(offset)
      f.write(bytes([byte ^ 0x55]))
  damage.__name__ = f'_flip_btree_byte_{offset}'
  return damage


def _garbage_metadata(step_dir):
  with open(os.path.join(step_dir, 'state', '_METADATA'), 'wb') as f:
    f.write(os.urandom(300))


def _missing_metadata(step_dir):
  os.remove(os.path.join(step_dir, 'state', '_METADATA'))


def _missing_manifest(step_dir):
  os.remove(os.path.join(step_dir, 'state', 'manifest.ocdbt'))


def _garbage_input_position(step_dir):
  with open(os.path.join(step_dir, 'data', 'process_0-of-1.json'), 'w') as f:
    f.write('{"cut off')


# What each gives, as found by damaging real checkpoints: truncated b-tree nodes TensorStore's
# OUT_OF_RANGE, a wrong byte at 16 a zstd failure (INVALID_ARGUMENT, its code left out of the
# message), at 128 a CRC mismatch (DATA_LOSS), truncated array data OUT_OF_RANGE wrapped in
# Orbax's bare Exception; garbage _METADATA UnicodeDecodeError, a missing _METADATA None in
# Orbax's metadata, a missing manifest NOT_FOUND, a cut-off input position JSONDecodeError.
DAMAGES = [_truncate_arrays, _truncate_array_data, _flip_btree_byte(16), _flip_btree_byte(128),
           _garbage_metadata, _missing_metadata, _missing_manifest, _garbage_input_position]


@pytest.mark.parametrize('damage', DAMAGES, ids=lambda d: d.__name__.strip('_'))
def test_damaged_newest_checkpoint_is_named_and_skipped(tmp_path, capsys, damage):
  state, mngr, root = _saved(tmp_path)
  damage(os.path.join(root, '6'))
  mngr = checkpoint.manager(str(tmp_path), keep=5)
  step, restored = checkpoint.restore(mngr, checkpoint.abstract(state), make_iterator())
  assert step == 4 and int(restored['step']) == 4
  out = capsys.readouterr().out
  assert f'Checkpoint {os.path.join(root, "6")} is damaged' in out
  assert sorted(os.listdir(root)) == ['2', '4', '6.damaged']
  # The step can be saved again once training gets back to it.
  checkpoint.save(mngr, 6, dict(state, step=jnp.int32(6)), make_iterator(), force=True)
  mngr.wait_until_finished()
  assert checkpoint.restore(mngr, checkpoint.abstract(state), make_iterator())[0] == 6


def _flip_array_byte(root, step, state):
  """Flips one bit of one raw byte of 'big' inside its stored data file, where TensorStore
  keeps the incompressible array verbatim; returns the file."""
  raw = np.asarray(state['params']['big']).tobytes()
  [path] = [p for p in _files(os.path.join(root, str(step)), 'state') if raw[:64] in
            open(p, 'rb').read()]
  with open(path, 'r+b') as f:
    data = bytearray(f.read())
    at = data.find(raw) + 4 * (17 * 64 + 3)  # big[17, 3]
    data[at] ^= 0x01
    f.seek(0)
    f.write(data)
  return path


def test_a_byte_flipped_in_a_stored_array_is_caught_by_its_checksum(tmp_path, capsys):
  """One raw byte of an array's data file changed on disk, which Orbax and TensorStore restore
  as valid data (they checksum the index, not the values): the step's CRC32s name the array,
  the step is set aside and the one before restores."""
  state, mngr, root = _saved(tmp_path)
  path = _flip_array_byte(root, 6, state)
  assert os.sep + os.path.join('6', 'state', 'ocdbt.process_0', 'd') + os.sep in path
  mngr = checkpoint.manager(str(tmp_path), keep=5)
  step, restored = checkpoint.restore(mngr, checkpoint.abstract(state), make_iterator())
  assert step == 4 and int(restored['step']) == 4
  jax.tree.map(np.testing.assert_array_equal, restored, dict(state, step=jnp.int32(4)))
  out = capsys.readouterr().out
  assert re.search(r"ChecksumMismatch: .*/6: array \['params'\]\['big'\] restores with other "
                   r'bytes than were saved', out), out
  assert sorted(os.listdir(root)) == ['2', '4', '6.damaged']


# A fresh interpreter with 2 simulated devices (set before jax starts): a state saved with
# 'big' split over both devices, restored onto one device.
OTHER_LAYOUT_SCRIPT = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding
from bengrapheme import checkpoint
assert jax.device_count() == 2, jax.devices()
split = NamedSharding(Mesh(np.array(jax.devices()), ('x',)), P('x'))
big = np.random.default_rng(0).integers(0, 2**32, (64, 64), dtype=np.uint32)
state = {'step': jnp.int32(6), 'params': {'w': jnp.arange(6.0), 'big': jax.device_put(big, split)}}
mngr = checkpoint.manager(sys.argv[1])
checkpoint.save(mngr, 6, state, force=True)
mngr.wait_until_finished()
one = SingleDeviceSharding(jax.devices()[0])
target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), state)
step, restored = checkpoint.restore(checkpoint.manager(sys.argv[1]), target)
assert step == 6 and np.array_equal(restored['params']['big'], big)
print('restored', step)
"""


def test_a_restore_onto_another_layout_says_it_could_not_check(tmp_path):
  flags = os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=2'
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=flags,
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
  result = subprocess.run([sys.executable, '-c', OTHER_LAYOUT_SCRIPT, str(tmp_path)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [line for line in result.stdout.splitlines() if 'CRC32' in line]
  assert lines == [
      f"Checkpoint {tmp_path}/checkpoints/6: 1 of 3 arrays restore onto another sharding "
      "layout than they were saved with (e.g. ['params']['big']), so their CRC32s could not be "
      "checked; the others were."], result.stdout
  assert 'restored 6' in result.stdout


def _orbax_wrapped(cause):
  """What Orbax raises when reading an array fails: a bare Exception, the failure its cause."""
  error = Exception('Encountered error while reading array index: (slice(0, 64, 1),)')
  error.__cause__ = cause
  return error


# Failures to read a good step: the step must stay, and the error reach the user.
TRANSIENT = {
    'timeout': TimeoutError('gs://bucket/run/checkpoints/6/state: read timed out'),
    'connection': ConnectionResetError(104, 'Connection reset by peer'),
    'memory': MemoryError('cannot allocate 4.0 GiB'),
    'tensorstore-unavailable': _orbax_wrapped(ValueError(
        'UNAVAILABLE: Error reading "params.w/0.0" in OCDBT database at gs://bucket/run/'
        'checkpoints/6/state/: HTTP response code: 503')),
    'tensorstore-deadline': ValueError(
        'DEADLINE_EXCEEDED: Error opening "zarr" driver: Error reading "params.w/.zarray"'),
    'device-memory': _orbax_wrapped(jax.errors.JaxRuntimeError(
        'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.')),
    'interrupt': _orbax_wrapped(KeyboardInterrupt()),
    'sharding': ValueError('One of device_put args was given the sharding of '
                           "NamedSharding(mesh=Mesh('data': 2), spec=PartitionSpec('data',)), "
                           'which implies that the global size of its dimension 0 should be '
                           'divisible by 2, but it is equal to 3'),
}


@pytest.mark.parametrize('call', ['item_metadata', 'restore'])
@pytest.mark.parametrize('error', TRANSIENT.values(), ids=TRANSIENT.keys())
def test_failure_to_read_a_good_step_moves_nothing_and_says_why(tmp_path, monkeypatch, capsys,
                                                                 call, error):
  state, mngr, root = _saved(tmp_path)
  mngr = checkpoint.manager(str(tmp_path), keep=5)

  def fail(*args, **kwargs):
    raise error

  monkeypatch.setattr(mngr, call, fail)
  with pytest.raises(type(error)) as raised:
    checkpoint.restore(mngr, checkpoint.abstract(state), make_iterator())
  assert raised.value is error  # the error itself, its message intact
  assert 'every checkpoint is left in place' in capsys.readouterr().out
  assert sorted(os.listdir(root)) == ['2', '4', '6']
  monkeypatch.undo()  # the fault passes: the newest step is still there to resume from
  assert checkpoint.restore(mngr, checkpoint.abstract(state), make_iterator())[0] == 6


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
  other = {'step': jnp.int32(0), 'params': {'w': jnp.zeros((4, 3)), 'b': jnp.zeros(3),
                                            'big': state['params']['big']}}
  with pytest.raises(checkpoint.ModelMismatchError,
                     match=r"params/b: not in the checkpoint; params/w: shape \(2, 3\) in the "
                           r"checkpoint, \(4, 3\) in this config"):
    checkpoint.restore(mngr, checkpoint.abstract(other))
  assert sorted(os.listdir(root)) == ['2']  # a good checkpoint is never moved aside


def test_ctrl_c_asks_to_save_and_a_second_one_stops_at_once(capsys):
  before = signal.getsignal(signal.SIGINT)
  with checkpoint.Preemption() as preemption:
    assert not preemption.reached(None, 1)
    os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: save at this step, then stop
    assert preemption.reached(None, 1) and preemption.interrupted
    assert 'Ctrl-C: saving the current step' in capsys.readouterr().out
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)  # the second: stop now
      time.sleep(1)  # the handler runs at the next bytecode; never reached
  assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C interrupts as usual again


def test_sigterm_asks_to_save_without_being_an_interruption():
  with checkpoint.Preemption() as preemption:
    os.kill(os.getpid(), signal.SIGTERM)
    assert preemption.reached(None, 1) and not preemption.interrupted
