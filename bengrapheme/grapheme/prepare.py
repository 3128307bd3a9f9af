"""Converts a Kaggle Bengali.AI split once into a random-access layout, and reads it for grain.

The Kaggle parquet files are "wide" (one row group, 32,332 pixel columns): reading one image
means decoding a 1.6 GB file. `prepare` validates the split and writes it row-major:

  CACHE_DIR/{split}-{key}/
    images.npy   uint8 [N, 137, 236], read through a memory map
    labels.npy   int32 [N, 3] (grapheme_root, vowel_diacritic, consonant_diacritic), -1 unknown
    index.json   image ids and grapheme strings, in row order
    meta.json    layout version, key, source files (written last)

Why a plain memory-mapped .npy: an image is a fixed 32,332 bytes at offset i * 32,332, so a
read is one memcpy from the page cache with no decoding, index lookup or record framing, and
numpy opens the file anywhere. `python -m bench.prepare_formats` (5,000 images, grain
shuffle + batch(64)) read it at ~16-19k images/s, ahead of uncompressed ArrayRecord
(~13k), zstd ArrayRecord (~7.6k) and parquet with 32-image row groups (~3k), and ~20x the
pandas.read_parquet way Kaggle notebooks read the wide files.

`key` hashes the layout version and the source files' names, sizes and mtimes, so a changed
file gets a new directory. The directory is built under a temporary name and renamed into
place, so a crash never leaves a partial directory under a name that `prepare` would reuse.
"""
import hashlib
import json
import os
import pathlib
import shutil
import socket

import numpy as np

from bengrapheme.grapheme import classes
from bengrapheme.grapheme import kaggle

LAYOUT_VERSION = 1
_TMP_PREFIX = '.tmp-'


def prepare(data_dir, split, cache_dir):
  """Validates `split` of a Kaggle data dir and converts it once; returns the prepared path.

  Reuses the cached conversion when the source files are unchanged. Safe to call from several
  processes at once: each builds its own temporary copy and the first rename wins.
  """
  data_dir = pathlib.Path(data_dir).resolve()
  cache_dir = pathlib.Path(cache_dir)
  files = [(path.name, path.stat().st_size, path.stat().st_mtime_ns)
           for path in kaggle.source_files(data_dir, split)]
  key = hashlib.sha256(json.dumps([LAYOUT_VERSION, split, files]).encode()).hexdigest()[:16]
  final = cache_dir / f'{split}-{key}'
  if (final / 'meta.json').exists():
    return final
  cache_dir.mkdir(parents=True, exist_ok=True)
  _remove_dead_builds(cache_dir)
  data = kaggle.validate(data_dir, split)
  tmp = cache_dir / f'{_TMP_PREFIX}{split}-{key}-{os.getpid()}@{socket.gethostname()}'
  try:
    tmp.mkdir()
    _write(tmp, data)
    meta = dict(version=LAYOUT_VERSION, split=split, key=key, num_images=len(data.image_ids),
                data_dir=str(data_dir), files=files)
    _write_file(tmp / 'meta.json', lambda f: f.write(json.dumps(meta, indent=1).encode()))
    try:
      tmp.rename(final)
    except OSError:
      # Another process renamed its identical build into place first.
      if not (final / 'meta.json').exists():
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  _remove_older_versions(cache_dir, split, final, str(data_dir))
  return final


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

  def __len__(self):
    return len(self.image_ids)

  def __getitem__(self, index):
    index = int(index)
    if not 0 <= index < len(self.image_ids):
      raise IndexError(f'index {index} out of range for {len(self.image_ids)} images')
    if self._images is None:
      # A plain ndarray view of the map: np.memmap slicing adds per-call overhead.
      self._images = np.asarray(np.load(self.path / 'images.npy', mmap_mode='r'))
    return dict(image=self._images[index].copy(), labels=self._labels[index].copy(),
                grapheme=self._grapheme_ids[index], index=np.int32(index))

  def __getstate__(self):
    state = self.__dict__.copy()
    state['_images'] = None
    return state

  def __repr__(self):
    return f'GraphemeSource({str(self.path)!r}, {len(self)} images)'


def _write(path, data):
  n = len(data.image_ids)
  images = np.lib.format.open_memmap(path / 'images.npy', mode='w+', dtype=np.uint8,
                                     shape=(n, kaggle.HEIGHT, kaggle.WIDTH))
  rows = {image_id: i for i, image_id in enumerate(data.image_ids)}
  # One parquet file at a time, straight into the map: memory stays at one column block.
  for shard in data.shards:
    shard.read_rows(images.reshape(n, kaggle.NUM_PIXELS),
                    [rows[image_id] for image_id in shard.image_ids])
  images.flush()
  del images
  _write_file(path / 'labels.npy', lambda f: np.save(f, data.labels.astype(np.int32)))
  index = json.dumps(dict(image_ids=data.image_ids, graphemes=data.graphemes),
                     ensure_ascii=False)
  _write_file(path / 'index.json', lambda f: f.write(index.encode('utf-8')))


def _write_file(path, write):
  # fsync so that after a power loss the renamed directory never holds empty files.
  with open(path, 'wb') as f:
    write(f)
    f.flush()
    os.fsync(f.fileno())


def _remove_dead_builds(cache_dir):
  """Removes temporary directories left by builds on this host that crashed."""
  host = socket.gethostname()
  for path in cache_dir.glob(f'{_TMP_PREFIX}*'):
    rest, _, path_host = path.name.rpartition('@')
    pid = rest.rpartition('-')[2]
    if path_host == host and pid.isdigit() and not _alive(int(pid)):
      shutil.rmtree(path, ignore_errors=True)


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, but another user's
    return True
  return True


def _remove_older_versions(cache_dir, split, keep, data_dir):
  """Removes earlier conversions of the same data dir, which a changed file made stale."""
  for path in cache_dir.glob(f'{split}-*'):
    try:
      meta = json.loads((path / 'meta.json').read_text())
    except (OSError, ValueError):
      continue
    if path != keep and meta.get('data_dir') == data_dir:
      shutil.rmtree(path, ignore_errors=True)
