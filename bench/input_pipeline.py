"""Input pipeline throughput: Kaggle conversion, grapheme batches, fragment batches.

  python -m bench.input_pipeline [--quick]

Every figure is against a reference timed in turns with it, the median of the turns:

- convert: the Kaggle wide parquet files -> the prepared layout (`prepare.prepare`:
  validation, decode, transpose, write and fsync), megabytes of pixels per second, against
  reading the same files the Kaggle-notebook way (pandas.read_parquet + to_numpy: decoding
  alone, nothing checked or written). No target: it runs once per dataset.
- grapheme batches: the trainer's own pipeline (`bengrapheme.input.train_dataset`: grain,
  shuffled, batched, threads, batch and rendered fraction as in configs/grapheme.py:kaggle)
  over the prepared split as the trainer opens it (the corrected labels over it, a sorted
  subset for train) with rendered images mixed in, uint8 137x236 batches:
  - against the same stream read record by record, as the reference keeps it
    (bench/reference_input.py); the two give the same batches, checked over two epochs of
    real images before the timing;
  - against the way public notebooks read this data: pandas.read_parquet of the four files,
    reshape, then shuffled batches from memory, one pass over the images with the load
    included. How fast those batches come once everything is loaded is in the note: a
    notebook pays the load once per run, this pipeline never (and never holds the 6.5 GB).
- fragment reader: `retrieval.fragments.reader.FragmentSource` (JPEG decode, fit into the
  configs/fragments.py:hisfrag20 square, validity checks) through the same grain pipeline,
  against a plain single-threaded PIL loop doing the decode and fit alone.
- fragment batches from the cache: what training reads every epoch (`retrieval.fragments.task` decodes
  each fragment once into a memory-mapped array), against the same PIL loop.

The grain pipelines are timed once running: each grain thread builds a whole batch, so the
first batches take a round of num_threads batches; that start is read untimed (see _stream).

Data is synthetic: Kaggle-layout images from bench.common (paper noise and strokes), and
fragments cut by retrieval.synthetic.synth from a few synthetic pages, copied under new names up to
the count needed (the same JPEG bytes decode at the same cost).
"""
import math
import os
import pathlib
import random
import shutil
import tempfile
import time

import grain
import numpy as np
from PIL import Image

from bench import common, reference_input
from bengrapheme import files, input as input_lib
from bengrapheme.grapheme import classes, data, kaggle, prepare

# Small, so that the batches in flight (one per grain thread) are few next to an epoch.
FRAGMENT_BATCH = 8


def _megabytes(n):
  return n * kaggle.NUM_PIXELS / 1e6


def _stream(dataset, count, num_threads):
  """Times `count` batches of a shuffled training stream once it runs.

  Each grain thread builds a whole batch, so the first batch comes only after num_threads
  batches' work; a training run reads for hours, so the rate that counts is the one after
  that start: num_threads batches are read untimed first.
  """
  it = iter(dataset)
  try:
    for _ in range(num_threads):
      next(it)
    start = time.perf_counter()
    images = sum(len(next(it)['index']) for _ in range(count))
    return common.Timed(time.perf_counter() - start, images)
  finally:
    it.close()  # cancels the read-ahead not yet started; what runs is let finish untimed
    common.settle()


def _rendered_stand_in(folder, n):
  """n images in the prepared layout, as grapheme/rendered.py writes its drawn ones."""
  folder.mkdir()
  images = files.open_memmap(folder / 'images.npy', np.uint8, (n, kaggle.HEIGHT, kaggle.WIDTH))
  images[:] = common.synthetic_images(n, seed=1)
  images.flush()
  del images
  rows = [classes.GRAPHEMES[i % len(classes.GRAPHEMES)] for i in range(n)]
  prepare.write_index(folder, 'rendered', [f'Rendered_{i}' for i in range(n)],
                      [row[3] for row in rows], [row[:3] for row in rows])
  return prepare.GraphemeSource(folder)


def _train_split(prepared, val_fraction):
  """The train split as grapheme/data.py opens it: a few corrected labels over the prepared
  split, a sorted subset of it."""
  full = prepare.GraphemeSource(prepared)
  rng = np.random.default_rng(0)
  corrections = {int(row): [1, 2, 7] for row in rng.choice(len(full), len(full) // 100)}
  keep = np.sort(rng.permutation(len(full))[round(len(full) * val_fraction):])
  return input_lib.Subset(data.Relabelled(full, corrections), keep)


def _assert_same_batches(reference, batched, count):
  """The two pipelines' first `count` batches: the same arrays in the same order."""
  a, b = iter(reference), iter(batched)
  try:
    for i in range(count):
      x, y = next(a), next(b)
      assert list(x) == list(y), (i, list(x), list(y))
      for key in x:
        assert x[key].dtype == y[key].dtype and np.array_equal(x[key], y[key]), (i, key)
  finally:
    a.close()
    b.close()
    common.settle()


def grapheme_benchmarks(workdir, n, repeats):
  from configs import grapheme as grapheme_config
  config = grapheme_config.get_config('kaggle')
  num_threads, batch = config.input.num_threads, config.train.batch_size
  fraction = config.render.fraction
  data_dir = workdir / 'kaggle'
  data_dir.mkdir()
  common.write_data_dir(data_dir, n, seed=0, shards=kaggle.NUM_SHARDS)
  megabytes = _megabytes(n)
  rendered = _rendered_stand_in(workdir / 'rendered', n // 4)

  def stream(pipeline):
    return pipeline(real, batch_size=batch, seed=0, process_index=0, process_count=1,
                    num_threads=num_threads, mixed_in=rendered, mixed_fraction=fraction)

  # In turns: the notebook way (load, then batches, timed apart), a conversion into a fresh
  # cache dir, 2n images' worth of batches of the trainer's pipeline over the first
  # conversion, read record by record (the reference) and a batch at a time.
  times = dict(load=[], batches=[], prepare=[], reference=[], grain=[])
  real, load = None, common.quiet_load_average()
  count = 2 * n // batch  # batches timed
  for r in range(repeats):
    start = time.perf_counter()
    images = common.pandas_load_split(data_dir)
    loaded = time.perf_counter()
    images_read = sum(len(b) for b in common.pandas_batches(images, batch))
    times['load'].append(loaded - start)
    times['batches'].append(time.perf_counter() - loaded)
    assert images_read == n
    del images
    start = time.perf_counter()
    path = prepare.prepare(data_dir, 'train', workdir / f'prepared-{r}')
    times['prepare'].append(time.perf_counter() - start)
    if real is None:
      real = _train_split(path, config.data.val_fraction)
      # Two epochs of the real images, rendered ones mixed in: the same batches both ways.
      _assert_same_batches(stream(reference_input.train_dataset),
                           stream(input_lib.train_dataset),
                           2 * math.ceil(len(real) / (batch * (1 - fraction))))
    else:
      shutil.rmtree(path.parent)
    for name, pipeline in [('reference', reference_input.train_dataset),
                           ('grain', input_lib.train_dataset)]:
      seconds, images_read = _stream(stream(pipeline), count, num_threads)
      times[name].append(seconds / images_read)

  turns = common.Turns({}, [{k: v[r] for k, v in times.items()} for r in range(repeats)],
                       (load, common.load_average()))
  rows = [common.timed_record(
      'Kaggle parquet -> prepared layout (convert)', 'MB/s',
      'pandas.read_parquet + to_numpy (read only)', turns,
      lambda t: (megabytes / t['prepare'], megabytes / t['load'], t['load'] / t['prepare']),
      note=f'{n:,} images of 137x236 in 4 wide parquet files, as Kaggle ships them (50,210 '
           'a file there); validation, decode, transpose, write + fsync')]
  setting = (f'batch {batch}, {fraction:.0%} rendered, {num_threads} grain threads, '
             f'{os.cpu_count()} cores')
  # The notebook's pass: load + batches of the same turn.
  notebook = lambda t: n / (t['load'] + t['batches'])
  rows.append(common.timed_record(
      'grapheme uint8 batches via grain (prepared layout)', 'images/s',
      'pandas.read_parquet + reshape, shuffled batches', turns,
      lambda t: (1 / t['grain'], notebook(t), 1 / t['grain'] / notebook(t)),
      target='>= 5x and >= 10,000 images/s',
      meets=lambda value, ratio: ratio >= 5 and value >= 10_000,
      note=f'{n:,} images, {setting}; the notebook way makes '
           f'{n / np.median(times["batches"]):,.0f} images/s once the files are loaded (pandas '
           'holds pixels column-major, so every image is a strided gather)'))
  rows.append(common.timed_record(
      'grapheme training batches read a batch at a time (sorted reads of the memory maps)',
      'images/s', 'the same stream read record by record (bench/reference_input.py)', turns,
      lambda t: (1 / t['grain'], 1 / t['reference'], t['reference'] / t['grain']),
      target='>= 5x', meets=lambda value, ratio: ratio >= 5,
      note=f'{len(real):,} real + {len(rendered):,} rendered images, {setting}; the same batches '
           'both ways (checked over two epochs)'))
  return rows


def fragment_folder(workdir, n, pages):
  """n fragment JPEGs named WID_PID_FID.jpg: synthetic fragments, copied under new names."""
  from retrieval.synthetic import synth
  pieces = workdir / 'pieces'
  synth.write_dataset(str(pieces), 1, 1, pages, seed=0, workers=1)  # pages a writer
  files = sorted(pieces.glob('*/*.jpg'))
  folder = workdir / 'fragments' / 'test'
  folder.mkdir(parents=True)
  for i in range(n):
    # 40 writers of 2 pages each, like HisFrag20's few fragments per page.
    shutil.copyfile(files[i % len(files)], folder / f'{i % 40 + 1}_{i % 80 + 1}_{i + 1}.jpg')
  shutil.rmtree(pieces)
  return folder


def pil_fit(path, size, color):
  """The plain PIL way: decode, fit into size x size keeping the aspect, centre on black."""
  with Image.open(path) as image:
    image = image.convert('RGB' if color else 'L')
    scale = size / max(image.size)
    new = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    image = image.resize(new, Image.Resampling.BILINEAR)
    canvas = Image.new(image.mode, (size, size))
    canvas.paste(image, ((size - new[0]) // 2, (size - new[1]) // 2))
    return np.asarray(canvas)


def pil_loop(paths, size, color, batch):
  order = list(paths)
  random.Random(0).shuffle(order)
  count = 0
  for begin in range(0, len(order) // batch * batch, batch):
    count += len(np.stack([pil_fit(p, size, color) for p in order[begin:begin + batch]]))
  return count


def fragment_benchmarks(workdir, n, pages, repeats):
  from configs import fragments as fragments_config
  from retrieval.fragments import data, reader
  config = fragments_config.get_config('hisfrag20')
  size, color = 512, False  # the reader's own fitted records, measured as before
  num_threads = config.input.num_threads
  folder = fragment_folder(workdir, n, pages)
  paths = sorted(str(p) for p in folder.iterdir())
  source = reader.FragmentSource(str(folder), size, color)
  turns = common.interleaved({
      'pil': lambda: pil_loop(paths, size, color, FRAGMENT_BATCH),
      'reader': lambda: _stream(
          input_lib.train_dataset(source, batch_size=FRAGMENT_BATCH, seed=0, process_index=0,
                                  process_count=1, num_threads=num_threads),
          len(source) // FRAGMENT_BATCH, num_threads),
  }, repeats)
  per_second = lambda name, t: turns[name][1] / t[name]  # each side counts its own images
  rows = [common.timed_record(
      f'fragment reader: JPEG decode + fit to {size} (grey) via grain', 'images/s',
      'plain PIL loop (decode + fit, one thread)', turns,
      lambda t: (per_second('reader', t), per_second('pil', t),
                 per_second('reader', t) / per_second('pil', t)),
      target='>= 5x', meets=lambda value, ratio: ratio >= 5,
      note=f'{n:,} synthetic fragments (~{_mean_side(paths):.0f} px), '
           f'{num_threads} grain threads, {os.cpu_count()} cores')]

  # What training reads: the ink-centred patches, extracted once into a memory map.
  config.unlock()
  config.data.dir = str(folder.parent)
  config.data.cache_dir = str(workdir / 'fragment-cache')
  start = time.perf_counter()
  patches = data.source(config, str(workdir), 'test')
  build = time.perf_counter() - start
  jpeg_bytes = sum(os.path.getsize(p) for p in paths)
  cache_bytes = sum(f.stat().st_size for f in patches.path.iterdir())
  pixels = sum(int(np.prod(Image.open(p).size)) for p in paths)
  batch = config.train.batch_size
  turns = common.interleaved({
      'pil': lambda: _patch_reference(paths, config.input.patch_size,
                                      config.input.max_patches),
      'cache': lambda: _patch_stream(patches, batch, num_threads),
  }, repeats)
  rows.append(common.timed_record(
      f'P x K patch batches ({config.input.patch_size}x{config.input.patch_size}) from the '
      'cache via grain, as training reads them', 'patches/s',
      'decode each fragment and crop its patches (PIL)', turns,
      lambda t: (per_second('cache', t), per_second('pil', t),
                 per_second('cache', t) / per_second('pil', t)),
      target='>= 5x', meets=lambda value, ratio: ratio >= 5,
      note=f'built once at {n / build:.1f} fragments/s; cache {cache_bytes / jpeg_bytes:.2f}x '
           f'the JPEG bytes, {cache_bytes / pixels:.3f} bytes a fragment pixel'))
  return rows


def _patch_stream(src, batch, num_threads):
  """Times the batches retrieval/fragments/data.py:train_data reads: a P x K draw of patch indices,
  then one gather from the memory map per batch (num_threads batches read untimed first)."""
  from retrieval.fragments import data
  sampler = data.PKBatches(src.patch_writer, 8, batch // 8, seed=0)
  dataset = grain.MapDataset.source(sampler).map(lambda idx: src.patches()[idx])
  it = iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=num_threads,
                                                      prefetch_buffer_size=num_threads)))
  try:
    for _ in range(num_threads):
      next(it)
    start = time.perf_counter()
    count = sum(len(next(it)) for _ in range(max(1, len(src) // batch)))
    return common.Timed(time.perf_counter() - start, count)
  finally:
    it.close()
    common.settle()


def _patch_reference(paths, size, per_fragment):
  """Patches per second the plain way: decode each JPEG with PIL, cut random crops."""
  rng, count = np.random.default_rng(0), 0
  for p in paths:
    grey = np.asarray(Image.open(p).convert('L'))
    h, w = grey.shape
    for _ in range(per_fragment):
      top, left = rng.integers(0, max(1, h - size)), rng.integers(0, max(1, w - size))
      count += grey[top:top + size, left:left + size].size > 0
  return count


def _mean_side(paths):
  sides = []
  for p in paths[:50]:
    with Image.open(p) as image:
      sides.append(max(image.size))
  return float(np.mean(sides))


def run(quick):
  repeats = common.MIN_REPEATS
  workdir = pathlib.Path(tempfile.mkdtemp(prefix='bench-input-'))
  try:
    rows = grapheme_benchmarks(workdir, 2_000 if quick else 10_000, repeats)
    rows += fragment_benchmarks(workdir, 64 if quick else 256, 1 if quick else 2, repeats)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  return rows


if __name__ == '__main__':
  common.main(__doc__, run)
