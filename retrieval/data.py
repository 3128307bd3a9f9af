"""Fragments for the trainer: a HisFrag20 folder (or TFDS build) decoded once into a
memory-mapped cache, and endless P x K batches (P writers, K fragments each) for the triplet
losses. JPEG decoding every epoch would starve 2 CPU cores; the device does the random crop,
augmentation and normalisation."""
import collections
import concurrent.futures
import json
import os

import grain
import jax
import numpy as np

from bengrapheme import cache, files
from retrieval import reader

CACHE_LAYOUT = 1  # bump when the cache's files change


class CachedFragments:
  """All fragments of one split, fitted to `size` and stored as one uint8 memmap."""

  def __init__(self, path, names, writer, page, valid_pixels):
    self.path, self.names = path, names
    self.writer_ids, self.page_ids, self.valid_pixels = writer, page, valid_pixels
    self._images = None

  def __len__(self):
    return len(self.names)

  def __getitem__(self, i):
    if self._images is None:  # opened lazily: each grain worker maps the file itself
      self._images = np.load(self.path, mmap_mode='r')
    return dict(image=np.asarray(self._images[i]), writer=self.writer_ids[i],
                page=self.page_ids[i], index=np.int32(i), valid_pixels=self.valid_pixels[i])

  def __getstate__(self):
    return dict(self.__dict__, _images=None)


def _build(src, folder):
  """Decodes and fits every fragment of a reader.FragmentSource into `folder` (in threads:
  Pillow releases the GIL). A bad fragment raises reader.DataError naming it."""
  images = np.lib.format.open_memmap(folder / 'images.npy', 'w+', np.uint8,
                                     (len(src), src.size, src.size, 3 if src.color else 1))
  valid = np.zeros(len(src), np.int32)

  def fill(i):
    record = src[i]
    images[i], valid[i] = record['image'], record['valid_pixels']

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    list(pool.map(fill, range(len(src))))
  images.flush()
  np.save(folder / 'valid_pixels.npy', valid)
  (folder / 'index.json').write_text(json.dumps(
      {'names': [os.path.basename(x.path) for x in src.fragments],
       'writer': src.writer_ids.tolist(), 'page': src.page_ids.tolist()}))


def _folder(config, split):
  if not config.data.dir:
    raise ValueError('no data: pass --data DIR (a folder with train/ and test/ of '
                     'WID_PID_FID.jpg fragments) or set config.data.dir')
  return os.path.join(config.data.dir, split)


def listing(config, split):
  """The split as a reader.FragmentSource (listed, nothing decoded yet): DATA/{split}, or the
  split of the TFDS build in config.data.tfds_dir (format 'tfds')."""
  size, color = config.input.load_size, config.input.color
  if config.data.format == 'tfds':
    if not config.data.tfds_dir:
      raise ValueError("config.data.format='tfds' needs config.data.tfds_dir, a TFDS data "
                       'dir holding a hisfrag20 build')
    # Imported only here: tensorflow_datasets takes ~0.5 s to import.
    from retrieval import tfds_hisfrag20
    return tfds_hisfrag20.TfdsFragmentSource(config.data.tfds_dir, split, size, color)
  if config.data.format != 'folder':
    raise ValueError(f"config.data.format={config.data.format!r}: expected 'folder' or 'tfds'")
  return reader.FragmentSource(_folder(config, split), size, color)


def source(config, workdir, split):
  """The fragments of DATA/{train,test} (or of the TFDS build), decoded once into
  WORKDIR/prepared (or cache_dir): a bengrapheme/cache.py entry keyed by the fragment files
  (or the build's record files) and the load size and colour."""
  src = listing(config, split)
  paths = (src.record_files if config.data.format == 'tfds'
           else [f.path for f in src.fragments])
  origin = config.data.tfds_dir if config.data.format == 'tfds' else _folder(config, split)
  entry = cache.build_once(files.prepared_dir(config, workdir), f'fragments-{split}', paths,
                           [CACHE_LAYOUT, src.size, src.color],
                           lambda folder: _build(src, folder), origin=origin)
  index = json.loads((entry / 'index.json').read_text())
  return CachedFragments(entry / 'images.npy', index['names'],
                         np.array(index['writer'], np.int32), np.array(index['page'], np.int32),
                         np.load(entry / 'valid_pixels.npy'))


class PKBatches:
  """Global batch b = P writers x K fragments each, a pure function of (seed, b).

  Writers with at least two fragments are drawn without replacement, then K of each writer's
  fragments (with replacement only when it has fewer than K), so every anchor has a positive.
  """

  def __init__(self, writer_ids, writers_per_batch, per_writer, seed):
    self.by_writer = [np.flatnonzero(writer_ids == w) for w in np.unique(writer_ids)]
    self.by_writer = [ids for ids in self.by_writer if len(ids) >= 2]
    if len(self.by_writer) < writers_per_batch:
      raise ValueError(f'P x K batches need {writers_per_batch} writers with 2+ fragments; '
                       f'the training set has {len(self.by_writer)}')
    self.p, self.k, self.seed = writers_per_batch, per_writer, seed

  def __len__(self):
    return 2**31 - 1  # endless; grain indexes batches by position

  def __getitem__(self, b):
    rng = np.random.default_rng([self.seed, b])
    writers = rng.choice(len(self.by_writer), self.p, replace=False)
    picks = [rng.choice(self.by_writer[w], self.k, replace=len(self.by_writer[w]) < self.k)
             for w in writers]
    return np.concatenate(picks)


def check_training_writers(fragments):
  """Raises DataError naming a writer with a single fragment, before anything is decoded.

  fragments: a folder, or a listing of reader.Fragment (a FragmentSource's). P x K batches
  pair every fragment with another of its writer, so training needs two of each. Evaluation
  takes such writers: their fragments are queries with no relevant item, left out of the
  averages (see retrieval/metrics.py).
  """
  if isinstance(fragments, (str, os.PathLike)):
    fragments = reader.list_fragments(fragments)
  counts = collections.Counter(f.writer for f in fragments)
  single = [f for f in fragments if counts[f.writer] == 1]
  if single:
    raise reader.DataError(
        f'{single[0].path}: writer {single[0].writer} has only this fragment (single-fragment '
        f'writers: {len(single)}); training needs at least 2 fragments of every writer, since '
        'P x K batches pair each fragment with another of its writer: add fragments of the '
        'writer or move it out of the training folder')


def train_data(config, workdir, local_batch):
  """This process's rows of each P x K global batch; the iterator state checkpoints."""
  check_training_writers(listing(config, 'train').fragments)
  src = source(config, workdir, 'train')
  p, k = config.train.writers_per_batch, config.train.batch_size // config.train.writers_per_batch
  if p * k != config.train.batch_size:
    raise ValueError(f'train.batch_size={config.train.batch_size} must be a multiple of '
                     f'train.writers_per_batch={p}')
  lo = jax.process_index() * local_batch
  sampler = PKBatches(src.writer_ids, p, k, config.seed)
  ds = grain.MapDataset.source(sampler).map(lambda idx: idx[lo:lo + local_batch])
  ds = ds.map(lambda idx: {key: np.stack([src[int(i)][key] for i in idx])
                           for key in ('image', 'writer', 'page')})
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=config.input.num_threads,
                                              prefetch_buffer_size=4))
