"""The training stream reads whole batches (input.ShuffledBatches for the order, one gather
per memory map for the records) and gives exactly what it gave record by record: the same
arrays in the same order, rendered mix included (bench/reference_input.py is that path)."""
import grain
import numpy as np
import pytest

from bench import reference_input
from bengrapheme import files, input as input_lib
from bengrapheme.grapheme import classes, data, kaggle, prepare


def prepared(folder, n, seed):
  """A prepared split of n random images, labels and graphemes (some unknown: -1)."""
  folder.mkdir()
  rng = np.random.default_rng(seed)
  images = files.open_memmap(folder / 'images.npy', np.uint8, (n, kaggle.HEIGHT, kaggle.WIDTH))
  images[:] = rng.integers(0, 256, images.shape, np.uint8)
  images.flush()
  del images
  graphemes = [g for *_, g in classes.GRAPHEMES[:20]] + ['?']
  prepare.write_index(folder, 'train', [f'Train_{i}' for i in range(n)],
                      [graphemes[i] for i in rng.integers(0, len(graphemes), n)],
                      rng.integers(0, 7, (n, 3)))
  return prepare.GraphemeSource(folder)


class RecordByRecord:
  """A source with no read_batch (as a TFDS build's): read one record at a time."""

  def __init__(self, source):
    self.source = source

  def __len__(self):
    return len(self.source)

  def __getitem__(self, i):
    return self.source[i]


@pytest.fixture(scope='module')
def sources(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('prepared')
  full = prepared(tmp / 'train', 150, seed=0)
  relabelled = data.Relabelled(full, {3: [1, 2, 3], 77: [0, 0, 0]})
  # The trainer's train split: a sorted subset of the relabelled images.
  real = input_lib.Subset(relabelled, np.sort(np.random.default_rng(1).permutation(150)[:130]))
  return real, prepared(tmp / 'rendered', 23, seed=2)


def batches(make, count, **kwargs):
  it = iter(make(**kwargs))
  try:
    return [next(it) for _ in range(count)]
  finally:
    it.close()


def assert_same_batches(got, expected):
  for b, (x, y) in enumerate(zip(got, expected, strict=True)):
    assert list(x) == list(y), b
    for key in y:
      assert x[key].dtype == y[key].dtype and x[key].shape == y[key].shape, (b, key)
      np.testing.assert_array_equal(x[key], y[key], err_msg=f'batch {b}: {key}')


@pytest.mark.parametrize('mix', ['none', 'rendered', 'record_by_record'])
@pytest.mark.parametrize('process_index, process_count', [(0, 1), (1, 2)])
def test_batches_equal_the_per_record_reference(sources, mix, process_index, process_count):
  real, rendered = sources
  kwargs = dict(source=real, batch_size=16 // process_count, seed=7,
                process_index=process_index, process_count=process_count, num_threads=2)
  if mix != 'none':
    kwargs.update(mixed_in=rendered if mix == 'rendered' else RecordByRecord(rendered),
                  mixed_fraction=0.25)
  # 40 batches: three epochs of the 130 real images, four of the 23 rendered ones.
  expected = batches(reference_input.train_dataset, 40, **kwargs)
  got = batches(input_lib.train_dataset, 40, **kwargs)
  assert_same_batches(got, expected)
  assert sorted(got[0]) == ['grapheme', 'image', 'index', 'labels']


def test_a_state_saved_by_the_per_record_stream_resumes_here(sources):
  real, rendered = sources
  kwargs = dict(source=real, batch_size=16, seed=7, process_index=0, process_count=1,
                num_threads=2, mixed_in=rendered, mixed_fraction=0.25)
  before = iter(reference_input.train_dataset(**kwargs))
  for _ in range(11):
    next(before)
  state = before.get_state()
  expected = [next(before) for _ in range(5)]
  before.close()
  after = iter(input_lib.train_dataset(**kwargs))
  after.set_state(state)
  assert_same_batches([next(after) for _ in range(5)], expected)
  after.close()


@pytest.mark.parametrize('length, batch_size, seed, mixed_length, fraction', [
    (37, 4, 3, 0, 0.0),
    (1000, 16, 5, 24, 0.25),
    (300, 8, 2**32 - 2, 70, 0.001),  # the last seed a mix takes; a tiny fraction
    (301, 7, 0, 40, 0.9),
    (2, 2, 1, 1, 0.5),
])
def test_sampler_orders_records_as_grain_does(length, batch_size, seed, mixed_length, fraction):
  indices = grain.MapDataset.range(length).shuffle(seed=seed).repeat()
  if fraction:
    extra = grain.MapDataset.range(length, length + mixed_length).shuffle(seed=seed + 1)
    indices = grain.MapDataset.mix([indices, extra.repeat()], [1 - fraction, fraction])
  expected = indices.batch(batch_size)
  sampler = input_lib.ShuffledBatches(length, batch_size, seed, mixed_length, fraction)
  epochs = 3 * (length + mixed_length) // batch_size + 2
  for b in [*range(epochs), 10**6, 10**9 + 7]:
    np.testing.assert_array_equal(sampler[b], expected[b], err_msg=f'batch {b}')


@pytest.mark.parametrize('length', [65536, 65537, 200_840])
def test_large_epochs_are_grains_shuffles(length):
  """Around 2**16 (the cipher's smallest block) and at the Kaggle training set's size; at
  65537 grain's block is one bit short (its shuffle repeats an index) and this follows it."""
  expected = grain.MapDataset.range(length).shuffle(seed=11).batch(512)
  sampler = input_lib.ShuffledBatches(length, 512, 11)
  for b in [0, 1, length // 1024, length // 512 - 1]:
    np.testing.assert_array_equal(sampler[b], expected[b], err_msg=f'batch {b}')


def test_seed_out_of_grains_range_is_refused():
  with pytest.raises(ValueError, match='seed 4294967295'):
    input_lib.ShuffledBatches(10, 2, 2**32 - 1, 5, 0.5)
