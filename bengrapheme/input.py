"""grain pipelines shared by both tasks: a checkpointable training stream and padded evals.

Sources are grain random-access sources returning dicts of numpy arrays; a source may also
write many records into a batch at once (`read_batch` here). The host only reads and stacks
uint8 images; all float work (resize, normalise, augmentation) happens on device inside the
jitted step.
"""
import functools
import math
import sys
import threading

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

  def read_batch(self, rows, batch, at):
    read_batch(self.source, self.indices[rows], batch, at)
    batch['index'][at] = rows

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


def read_batch(source, rows, batch, at):
  """Writes records `rows` (an int array) of `source` into `batch` (a dict of arrays, one row
  per example): record rows[j] into row at[j].

  A source with a `read_batch(rows, batch, at)` method writes them at once
  (prepare.GraphemeSource: straight from its memory map, in the order of `rows`); any other
  is read record by record.
  """
  if hasattr(source, 'read_batch'):
    return source.read_batch(rows, batch, at)
  for i, j in zip(rows.tolist(), at.tolist()):
    for k, v in source[i].items():
      batch[k][j] = v


class ShuffledBatches:
  """protocols.Sampler: the record indices of global batch b of an endless stream that is
  reshuffled every epoch, optionally mixed with a second one (indices from `length` on).

  The order is grain's (0.2.18, pinned in pyproject.toml) for
    indices = MapDataset.range(length).shuffle(seed).repeat()
    indices = MapDataset.mix([indices, MapDataset.range(length, length + mixed_length)
                              .shuffle(seed + 1).repeat()], [1 - f, f])  # with a mix
    indices.batch(batch_size)[b]
  the order training streams had before they read whole batches, so a checkpoint saved then
  resumes at the same record. It is computed here with numpy, a batch at a time, because
  those datasets make Python calls per record and layer, which took longer than reading the
  records.
  tests/grapheme/test_batched_input.py checks it against grain.
  """

  def __init__(self, length, batch_size, seed, mixed_length=0, mixed_fraction=0.0):
    if not 0 <= seed < 2**32 - bool(mixed_fraction):
      raise ValueError(f'seed {seed}: grain shuffles with seeds in 0..2**32-1 (seed + 1 too '
                       'with a mix)')
    self.length, self.batch_size, self.seed = length, batch_size, seed
    self.mixed_length = mixed_length
    self._weights = None
    if mixed_fraction:  # grain.MapDataset.mix's integer weights
      shares = [1 - mixed_fraction, mixed_fraction]
      scale = 100 / min(shares)
      self._weights = [int(share * scale) for share in shares]

  def __len__(self):
    return sys.maxsize // self.batch_size  # endless

  def __getitem__(self, b):
    positions = np.arange(b * self.batch_size, (b + 1) * self.batch_size, dtype=np.int64)
    if not self._weights:
      return _shuffled(positions, self.length, self.seed)
    stream, key = _mixed(positions, self._weights)
    indices = np.empty_like(positions)
    ours = stream == 0
    indices[ours] = _shuffled(key[ours], self.length, self.seed)
    indices[~ours] = self.length + _shuffled(key[~ours], self.mixed_length, self.seed + 1)
    return indices


def _mixed(positions, weights):
  """(stream, position in it) of each position of grain's mix with integer `weights`
  (grain's _dataset_and_key_of_next_element: the stream whose running count of
  floor(k * its share) steps up at k). Exact in int64 while positions * sum(weights) < 2**63,
  far past any training run."""
  stream = np.full(len(positions), -1)
  key = np.zeros(len(positions), np.int64)
  remaining = sum(weights)
  k, k1 = positions, positions + 1
  for i, weight in enumerate(weights):
    rest, rest1 = k * (remaining - weight) // remaining, k1 * (remaining - weight) // remaining
    hit = (stream < 0) & (k - rest != k1 - rest1)
    stream[hit], key[hit] = i, (k1 - rest1)[hit] - 1
    remaining -= weight
    k, k1 = rest, rest1
  return stream, key


def _shuffled(positions, length, seed):
  """Elements `positions` of grain's range(length).shuffle(seed).repeat(): epoch e is the
  permutation index_shuffle draws with seed + e (grain's ShuffleMapDataset)."""
  epoch, index = np.divmod(positions, length)
  out = np.empty_like(positions)
  for e in np.unique(epoch):
    here = epoch == e
    with _permutation_lock:  # one reading thread draws an epoch; the others wait for it
      permutation = _permutation(length, (seed + int(e)) % 2**32)
    out[here] = permutation[index[here]]
  return out


_permutation_lock = threading.Lock()


@functools.lru_cache(maxsize=8)  # the epochs in flight of a stream or two
def _permutation(length, seed):
  """grain's index_shuffle(i, length - 1, seed, rounds=4) for every i < length
  (grain/_src/python/experimental/index_shuffle/index_shuffle.cc): a 4-round Simon block
  cipher on the smallest even number of bits >= 16 that counts past length - 1, keyed by
  std::seed_seq{seed}, applied again while the result is >= length (cycle walking).

  The cipher is applied once to its whole domain (< 4 * length values, or 2**16), then the
  walks are taken by pointer doubling, in a few passes however long they are (small
  datasets walk thousands of steps)."""
  if length == 1:
    return np.zeros(1, np.int64)
  bits = math.ceil(math.log2(length - 1))
  half = max(bits + bits % 2, 16) // 2
  domain = 1 << 2 * half
  step = _simon(np.arange(domain, dtype=np.uint64), _round_keys(seed), half).astype(np.int64)
  # Invariant: step[x] is a value on x's walk with none below length before it; found[x]
  # when it is the first below length.
  found = step < length
  # An index past the domain (length - 1 == 2**bits exactly) is cut to its low bits, as
  # index_shuffle's fixed-width words cut it.
  start = np.arange(length) % domain
  while not found[start].all():
    found, step = found | found[step], np.where(found, step, step[step])
  return step[start]


def _simon(value, keys, half):
  """Simon encryption of `value` (uint64 array) in two words of `half` bits each."""
  mask = np.uint64((1 << half) - 1)

  def rotl(x, r):
    return ((x << np.uint64(r)) | (x >> np.uint64(half - r))) & mask

  def f(x):
    return (rotl(x, 1) & rotl(x, 8)) ^ rotl(x, 2)

  left, right = (value >> np.uint64(half)) & mask, value & mask
  for k1, k2 in zip(keys[::2], keys[1::2]):
    left ^= f(right) ^ (np.uint64(k1) & mask)
    right ^= f(left) ^ (np.uint64(k2) & mask)
  return (left << np.uint64(half)) | right


def _round_keys(seed):
  """The 4 words C++'s std::seed_seq{seed}.generate() fills (the standard's algorithm,
  [rand.util.seedseq], at n = 4: t = 1, p = 1, q = 2): index_shuffle's round keys."""
  m32 = 0xFFFFFFFF
  w = [0x8b8b8b8b] * 4
  for k in range(4):
    r1 = 1664525 * _xorshift27(w[k] ^ w[(k + 1) % 4] ^ w[(k - 1) % 4]) & m32
    r2 = (r1 + (1 if k == 0 else k + seed if k == 1 else k)) & m32
    w[(k + 1) % 4] = (w[(k + 1) % 4] + r1) & m32
    w[(k + 2) % 4] = (w[(k + 2) % 4] + r2) & m32
    w[k] = r2
  for k in range(4, 8):
    r3 = 1566083941 * _xorshift27((w[k % 4] + w[(k + 1) % 4] + w[(k - 1) % 4]) & m32) & m32
    r4 = (r3 - k % 4) & m32
    w[(k + 1) % 4] ^= r3
    w[(k + 2) % 4] ^= r4
    w[k % 4] = r4
  return w


def _xorshift27(x):
  return x ^ (x >> 27)


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
  n = len(source)
  if mixed_fraction and (not 0 < mixed_fraction < 1 or mixed_in is None or len(mixed_in) == 0):
    raise ValueError(f'mixed_fraction {mixed_fraction} needs a non-empty mixed_in source '
                     'and a fraction in (0, 1)')
  # Indices past n are mixed_in's records.
  sampler = ShuffledBatches(n, batch_size * process_count, seed,
                            len(mixed_in) if mixed_fraction else 0, mixed_fraction)

  template = source[0]  # the keys, shapes and dtypes of a record

  def read(rows):
    batch = {k: np.empty((len(rows),) + np.shape(v), np.asarray(v).dtype)
             for k, v in template.items()}
    # Each source is read in ascending row order (one pass over its memory map), every
    # record written straight to its place in the batch.
    order = np.argsort(rows, kind='stable')
    ascending = rows[order]
    cut = np.searchsorted(ascending, n)
    read_batch(source, ascending[:cut], batch, order[:cut])
    if cut < len(rows):
      read_batch(mixed_in, ascending[cut:] - n, batch, order[cut:])
    return batch

  # Global batch b is the same run of examples, in the same order, whatever the process
  # count (augmentation draws by position in it).
  return train_stream(sampler, read, local_batch=batch_size, process_index=process_index,
                      num_threads=num_threads)


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
