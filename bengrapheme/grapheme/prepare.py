"""Converts a Kaggle Bengali.AI split once into a random-access layout, and reads it for grain.

The Kaggle parquet files are "wide" (one row group, 32,332 pixel columns): reading one image
means decoding a 1.6 GB file. `prepare` validates the split and writes it row-major:

  CACHE_DIR/{split}-{key}/
    images.npy   uint8 [N, 137, 236], read through a memory map
    labels.npy   int32 [N, 3] (grapheme_root, vowel_diacritic, consonant_diacritic), -1 unknown
    index.json   image ids and grapheme strings, in row order
    meta.json    layout version, split, number of images
    cache.json   the cache key, source, and each file's size and fingerprint (written last:
                 the entry is complete; checked on every open, bengrapheme/cache.py)

Why a plain memory-mapped .npy: an image is a fixed 32,332 bytes at offset i * 32,332, so a
read is one memcpy from the page cache with no decoding, index lookup or record framing, and
numpy opens the file anywhere. `python -m experiments.prepare_formats` (5,000 images, grain
shuffle + batch(64)) read it at ~16-19k images/s, ahead of uncompressed ArrayRecord
(~13k), zstd ArrayRecord (~7.6k) and parquet with 32-image row groups (~3k), and ~20x the
pandas.read_parquet way Kaggle notebooks read the wide files.

The folder is a bengrapheme/cache.py entry: keyed by the layout version and the source files,
built once under a temporary name and renamed into place.
"""
import json
import pathlib

import numpy as np

from bengrapheme import cache, console, files
from bengrapheme.grapheme import classes
from bengrapheme.grapheme import kaggle

LAYOUT_VERSION = 1


def prepare(data_dir, split, cache_dir):
  """Validates `split` of a Kaggle data dir and converts it once; returns the prepared path.

  Reuses the cached conversion when the source files are unchanged. Safe to call from several
  processes at once (bengrapheme/cache.py).
  """
  data_dir = pathlib.Path(data_dir).resolve()

  def build(folder):
    console.say(f'Validating the {split} files of {data_dir}...')
    data = kaggle.validate(data_dir, split)
    _write_images(folder, data)
    write_index(folder, split, data.image_ids, data.graphemes, data.labels)

  return cache.build_once(cache_dir, split, kaggle.source_files(data_dir, split),
                          LAYOUT_VERSION, build, origin=data_dir)


class GraphemeSource:
  """A grain random-access source over a prepared split.

  Returns dict(image=uint8 [137, 236], labels=int32 [3] (-1 unknown), grapheme=int32
  whole-grapheme id (-1 unseen or unknown), index=int32 row). Thread-safe and picklable: the
  memory map is opened lazily in each process and is read-only, so threads share it safely
  (unlike a parquet reader, whose buffers are per-handle state).
  """

  def __init__(self, prepared_path):
    self.path = pathlib.Path(prepared_path)
    meta = json.loads((self.path / 'meta.json').read_text())
    if meta['version'] != LAYOUT_VERSION:
      raise ValueError(f'{self.path}: layout version {meta["version"]}, expected '
                       f'{LAYOUT_VERSION}; run prepare() again')
    index = json.loads((self.path / 'index.json').read_text(encoding='utf-8'))
    self.split = meta['split']
    self.image_ids = index['image_ids']
    # Grapheme ids are looked up here rather than stored, so the cache does not go stale
    # when the grapheme table changes.
    self.graphemes = index['graphemes']
    ids = {g: classes.grapheme_id(g) for g in set(self.graphemes)}
    self._grapheme_ids = np.array([ids[g] for g in self.graphemes], np.int32)
    self._labels = np.load(self.path / 'labels.npy')
    self._images = None

  @property
  def labels(self):
    """int32 [N, 3], every row's labels, read without touching the images."""
    return self._labels

  def __len__(self):
    return len(self.image_ids)

  def __getitem__(self, index):
    index = int(index)
    if not 0 <= index < len(self.image_ids):
      raise IndexError(f'{self.path}: index {index} out of range for {len(self)} images')
    return dict(image=self._map()[index].copy(), labels=self._labels[index].copy(),
                grapheme=self._grapheme_ids[index], index=np.int32(index))

  def read_batch(self, rows, batch, at):
    """Writes the records at `rows` (an int array) into rows `at` of `batch` (input.read_batch),
    reading the memory map in the order of `rows`.

    Image by image, straight into its row of the batch: a numpy gather and then a scatter
    into the batch's order would copy every image twice, through a second batch-sized array
    of fresh pages, which cost more than this loop with the trainer's reading threads.
    """
    rows = np.asarray(rows, np.int64)
    bad = rows[(rows < 0) | (rows >= len(self))]
    if len(bad):
      raise IndexError(f'{self.path}: index {bad[0]} out of range for {len(self)} images')
    images, out = self._map(), batch['image']
    for i, j in zip(rows.tolist(), at.tolist()):
      out[j] = images[i]
    batch['labels'][at] = self._labels[rows]
    batch['grapheme'][at] = self._grapheme_ids[rows]
    batch['index'][at] = rows

  def _map(self):
    if self._images is None:
      # A plain ndarray view of the map: np.memmap slicing adds per-call overhead.
      self._images = np.asarray(np.load(self.path / 'images.npy', mmap_mode='r'))
    return self._images

  def __getstate__(self):
    state = self.__dict__.copy()
    state['_images'] = None
    return state

  def __repr__(self):
    return f'GraphemeSource({str(self.path)!r}, {len(self)} images)'


def _write_images(path, data):
  n = len(data.image_ids)
  images = files.open_memmap(path / 'images.npy', np.uint8, (n, kaggle.HEIGHT, kaggle.WIDTH))
  rows = {image_id: i for i, image_id in enumerate(data.image_ids)}
  # One parquet file at a time, straight into the map: memory stays at one column block.
  with console.Progress(n, 'converting images', unit='image') as progress:
    for shard in data.shards:
      shard.read_rows(images.reshape(n, kaggle.NUM_PIXELS),
                      [rows[image_id] for image_id in shard.image_ids])
      progress.update(len(shard.image_ids))
  images.flush()
  del images


def write_index(path, split, image_ids, graphemes, labels):
  """Writes labels.npy, index.json and meta.json beside a folder's images.npy."""
  np.save(path / 'labels.npy', np.asarray(labels, np.int32))
  index = json.dumps(dict(image_ids=list(image_ids), graphemes=list(graphemes)),
                     ensure_ascii=False)
  (path / 'index.json').write_text(index, encoding='utf-8')
  meta = dict(version=LAYOUT_VERSION, split=split, num_images=len(image_ids))
  (path / 'meta.json').write_text(json.dumps(meta, indent=1))
