"""grain pipelines shared by both tasks: a checkpointable training stream and padded evals.

Sources are grain random-access sources returning dicts of numpy arrays. The host only reads
and stacks uint8 images; all float work (resize, normalise, augmentation) happens on device
inside the jitted step.
"""
import math

import grain
import numpy as np

from bengrapheme import protocols


def data_dir(config, *, folder, error):
  """Where config.data says the data is: data.tfds_dir for format 'tfds', else data.dir
  (`folder`, as the no-data message describes it). Raises `error` when data.dir is not set;
  the task's validate has checked data.format and tfds_dir."""
  data = config.data
  if data.format == 'tfds':
    return data.tfds_dir
  if not data.dir:
    raise error(f'no data: pass --data DIR ({folder}) or set config.data.dir')
  return data.dir


class Subset:
  """A random-access view of `source` at `indices` (e.g. a validation hold-out); record i
  carries index = i, its row here, as every source's records do."""

  def __init__(self, source, indices):
    self.source, self.indices = source, np.asarray(indices, np.int64)

  def __len__(self):
    return len(self.indices)

  def __getitem__(self, i):
    return dict(self.source[int(self.indices[i])], index=np.int32(i))

  @property
  def labels(self):
    return self.source.labels[self.indices]


def train_stream(sampler, read, *, local_batch, process_index, num_threads=8):
  """Endless per-process batches of a training stream; `.get_state()` resumes it.

  sampler: a protocols.Sampler (sampler[b] the record indices of global batch b). Every
  process reads its own rows of each global batch, process_index * local_batch on, as
  read(indices) -> a batch dict.
  """
  protocols.check(sampler, protocols.Sampler, 'the training sampler')
  lo = process_index * local_batch
  ds = grain.MapDataset.source(sampler).map(lambda indices: read(indices[lo:lo + local_batch]))
  return ds.to_iter_dataset(_read_options(num_threads))


def train_dataset(source, *, batch_size, seed, process_index, process_count,
                  num_threads=8, mixed_in=None, mixed_fraction=0.0):
  """train_stream over `source`, reshuffled every epoch: batch_size records a process.

  With `mixed_in` (another source of the same records), a fraction `mixed_fraction` of every
  batch comes from it, each source shuffled and repeated on its own, so neither's epoch length
  sets the other's (grain interleaves by the weights, deterministically).
  Every process sees a disjoint 1/process_count slice of each shuffled epoch.
  """
  if len(source) < batch_size * process_count:
    raise ValueError(f'training set of {len(source)} examples is smaller than one global '
                     f'batch ({batch_size * process_count})')
  # The stream of indices, `mixed_in`'s after `source`'s: shuffling and mixing look only at
  # the lengths, so these are the positions the records themselves would take.
  n = len(source)
  indices = grain.MapDataset.range(n).shuffle(seed=seed).repeat()
  if mixed_fraction:
    if not 0 < mixed_fraction < 1 or mixed_in is None or len(mixed_in) == 0:
      raise ValueError(f'mixed_fraction {mixed_fraction} needs a non-empty mixed_in source '
                       'and a fraction in (0, 1)')
    extra = grain.MapDataset.range(n, n + len(mixed_in)).shuffle(seed=seed + 1).repeat()
    indices = grain.MapDataset.mix([indices, extra], [1 - mixed_fraction, mixed_fraction])

  def read(rows):
    records = [source[i] if i < n else mixed_in[i - n] for i in rows.tolist()]
    return {k: np.stack([r[k] for r in records]) for k in records[0]}

  # Global batch b is the same run of examples, in the same order, whatever the process
  # count (augmentation draws by position in it).
  return train_stream(indices.batch(batch_size * process_count), read, local_batch=batch_size,
                      process_index=process_index, num_threads=num_threads)


def _read_options(num_threads):
  # The buffer counts batches (the elements here), not examples: two per thread keep every
  # thread busy and host memory at a few batches. (It was 2 x batch_size batches: up to 4 GB
  # at the kaggle config's 256 images of 32 KB, and at prediction it held a whole file's
  # images a second time: 8.3 GB peak for the 200,840-image test set, bench/real_sizes.py.)
  return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=2 * num_threads)


def eval_batches(source, *, batch_size, process_index, process_count, num_threads=8):
  """Yields every example once, in order, as per-process batches padded with mask = 0.

  Records carry `index`, their row in `source`, which places each output back in row order.

  All processes yield the same number of batches, so sharded eval steps never wait on a
  process that has run out of data.
  """
  if len(source) == 0:
    raise ValueError('evaluation split is empty')
  shard = grain.MapDataset.source(source)[process_index::process_count]
  num_batches = math.ceil(math.ceil(len(source) / process_count) / batch_size)
  batches = iter(shard.batch(batch_size).to_iter_dataset(_read_options(num_threads)))
  # Padding copies the shapes of the first example, which every process can read.
  template = {k: np.asarray(v)[None][:0] for k, v in source[0].items()}
  try:
    for _ in range(num_batches):
      batch = next(batches, None)
      if batch is None:  # this process has fewer examples than the others: send padding
        batch = template
      n = len(next(iter(batch.values())))
      pad = batch_size - n
      padded = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
                for k, v in batch.items()}
      padded['mask'] = np.arange(batch_size) < n
      yield padded
  finally:
    # Its reading threads hold the source (a window of images at prediction) until closed.
    batches.close()
