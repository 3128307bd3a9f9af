"""Which random-access layout `prepare` should write: conversion speed and grain read speed.

  python -m experiments.prepare_formats --images 5000

Writes a synthetic wide parquet in the Kaggle layout (image-like pixels: paper noise and dark
strokes, so it compresses like the real scans), converts it into each candidate layout, and
reads every image once through the pipeline the trainer uses:

  grain.MapDataset.source(src).shuffle(seed).batch(64).to_iter_dataset()

The reference is how public Kaggle notebooks read this data: pandas.read_parquet of the wide
file, `.to_numpy().reshape(-1, 137, 236)`, then shuffled batches from that array. It is
measured in the same run; every layout is printed as a ratio against one reference pass
(load + batches, "x reference") and against its batches alone once loaded ("x loaded"; the
array is a column-major view of pandas' block, so even in-memory batches gather strided bytes).
Conversion speed is megabytes of pixels per second from the wide parquet, validation
included. Timings are wall clock with a warm page cache.

Candidates:
  npy          uint8 [N, 137, 236] .npy read through a memory map (what prepare writes)
  arrayrecord  ArrayRecord, group_size:1, one raw 32,332-byte record per image (zstd:3, the
               default, and uncompressed); TFDS's array_record builder writes the same files
  parquet      compact parquet: one fixed-size binary column, row groups of 32 images
"""
import argparse
import os
import pathlib
import shutil
import tempfile
import threading
import time

import grain
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from array_record.python import array_record_data_source
from array_record.python import array_record_module

from bench.common import pandas_reference, write_data_dir
from bengrapheme.grapheme import kaggle
from bengrapheme.grapheme import prepare

PARQUET_ROW_GROUP = 32


def read_split(data_dir):
  """Validated split and its pixels in memory [N, 32332], for the writers that need rows."""
  split = kaggle.validate(data_dir, 'train')
  pixels = np.empty((len(split.image_ids), kaggle.NUM_PIXELS), np.uint8)
  rows = {image_id: i for i, image_id in enumerate(split.image_ids)}
  for shard in split.shards:
    shard.read_rows(pixels, [rows[image_id] for image_id in shard.image_ids])
  return split, pixels


def item(image, labels, index):
  return dict(image=image.reshape(kaggle.HEIGHT, kaggle.WIDTH), labels=labels[index].copy(),
              grapheme=np.int32(-1), index=np.int32(index))


class ArrayRecordSource:
  """grain source over raw-byte ArrayRecord images (ArrayRecordDataSource is picklable and
  opens its readers lazily)."""

  def __init__(self, path, labels):
    self._records = array_record_data_source.ArrayRecordDataSource(str(path))
    self._labels = labels

  def __len__(self):
    return len(self._records)

  def __getitem__(self, index):
    return item(np.frombuffer(self._records[index], np.uint8), self._labels, index)


def write_arrayrecord(data_dir, path, options):
  split, pixels = read_split(data_dir)
  writer = array_record_module.ArrayRecordWriter(str(path), options)
  for row in pixels:
    writer.write(row.tobytes())
  writer.close()
  return ArrayRecordSource(path, split.labels)


class ParquetSource:
  """grain source over compact parquet; one ParquetFile per thread (a shared one segfaults
  under grain's thread pool)."""

  def __init__(self, path, labels, length):
    self._path = str(path)
    self._labels = labels
    self._length = length
    self._local = threading.local()

  def __len__(self):
    return self._length

  def __getitem__(self, index):
    if not hasattr(self._local, 'file'):
      self._local.file = pq.ParquetFile(self._path)
    group, row = divmod(index, PARQUET_ROW_GROUP)
    column = self._local.file.read_row_group(group, columns=['image']).column(0).chunk(0)
    image = np.frombuffer(column.buffers()[1], np.uint8, kaggle.NUM_PIXELS,
                          (column.offset + row) * kaggle.NUM_PIXELS)
    return item(image.copy(), self._labels, index)

  def __getstate__(self):
    state = self.__dict__.copy()
    del state['_local']
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._local = threading.local()


def write_parquet(data_dir, path):
  split, pixels = read_split(data_dir)
  images = pa.FixedSizeBinaryArray.from_buffers(
      pa.binary(kaggle.NUM_PIXELS), len(pixels), [None, pa.py_buffer(pixels)])
  table = pa.table({'image_id': split.image_ids, 'image': images})
  pq.write_table(table, path, row_group_size=PARQUET_ROW_GROUP, compression='none')
  return ParquetSource(path, split.labels, len(pixels))


def write_npy(data_dir, path):
  return prepare.GraphemeSource(prepare.prepare(data_dir, 'train', path))


def grain_pass(source, batch):
  """Images per second reading every image once in shuffled batches through grain."""
  dataset = grain.MapDataset.source(source).shuffle(seed=0).batch(batch).to_iter_dataset()
  start = time.perf_counter()
  count = sum(len(b['index']) for b in dataset)
  assert count == len(source)
  return count / (time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--images', type=int, default=5000)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2, help='grain passes; the best counts')
  parser.add_argument('--workdir', help='where to write (default: a temporary dir, removed)')
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix='prepare_formats-'))
  try:
    data_dir = workdir / 'data'
    data_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    write_data_dir(data_dir, args.images, seed=0)
    wide = data_dir / kaggle.image_parquet_name('train', 0)
    megabytes = args.images * kaggle.NUM_PIXELS / 1e6
    print(f'{args.images} images, {megabytes:.0f} MB of pixels, wide parquet '
          f'{os.path.getsize(wide) / 1e6:.0f} MB (written in {time.perf_counter() - start:.1f} s)')

    reference, reference_memory = pandas_reference(wide, args.batch)
    print(f'reference pandas.read_parquet + reshape + batches: {reference:,.0f} images/s '
          f'({reference_memory:,.0f} images/s once loaded)')

    layouts = {
        'npy': lambda path: write_npy(data_dir, path),
        'arrayrecord-zstd': lambda path: write_arrayrecord(data_dir, path, 'group_size:1'),
        'arrayrecord-raw': lambda path: write_arrayrecord(data_dir, path,
                                                          'group_size:1,uncompressed'),
        'parquet': lambda path: write_parquet(data_dir, path),
    }
    print(f'{"layout":18} {"convert MB/s":>12} {"size MB":>8} {"grain images/s":>15} '
          f'{"x reference":>12} {"x loaded":>9}')
    for name, write in layouts.items():
      path = workdir / name
      start = time.perf_counter()
      source = write(path)
      convert = megabytes / (time.perf_counter() - start)
      size = sum(f.stat().st_size for f in ([path] if path.is_file() else path.rglob('*'))
                 if f.is_file())
      rate = max(grain_pass(source, args.batch) for _ in range(args.repeats))
      print(f'{name:18} {convert:12.0f} {size / 1e6:8.0f} {rate:15,.0f} '
            f'{rate / reference:12.1f} {rate / reference_memory:9.1f}', flush=True)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)


if __name__ == '__main__':
  main()
