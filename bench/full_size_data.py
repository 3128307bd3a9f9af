"""Writes a full-size Bengali.AI folder (Kaggle layout, realistic bytes) in minutes, not hours.

  python -m bench.full_size_data --out DIR --train 200840 --test 200840

Rendering 400,000 graphemes one by one would take ~50 core-minutes, and their timing says
nothing the renderer's own bench does not. Instead a tile of `--tile` images is rendered by
the synthetic generator (bengrapheme/grapheme/synth.py: real graphemes and unseen ones, test
with held-out fonts), and every full-size image is a tile image shifted by a few pixels with
fresh paper noise. So the files have the real shape (4 parquet files a split of ~50,210 rows,
one row group each, 32,333 columns, pyarrow's default snappy + dictionary pages as the
pandas/pyarrow writer of the real files used) and about the real bytes (each pixel column
holds ~100-250 distinct values: ~1 byte a pixel after encoding, as the real scans; blank or
repeated images would compress to a fraction of that and decode faster than the real ones).
Labels and graphemes follow the tile image; test_labels.csv is written too.
"""
import argparse
import csv
import os
import shutil
import tempfile
import time

import numpy as np

from bengrapheme import files
from bengrapheme.grapheme import classes, kaggle, synth

KAGGLE_TRAIN_IMAGES = 200_840  # train.csv; the test set is "essentially the same size"


def _read_tile(tile_dir, split):
  """(image ids, images [N, 137, 236], label rows) of a split of the rendered tile."""
  data = kaggle.validate(tile_dir, split)
  n = len(data.image_ids)
  images = np.empty((n, kaggle.NUM_PIXELS), np.uint8)
  rows = {image_id: i for i, image_id in enumerate(data.image_ids)}
  for shard in data.shards:
    shard.read_rows(images, [rows[i] for i in shard.image_ids])
  names = 'test_labels.csv' if split == 'test' else 'train.csv'
  with open(os.path.join(tile_dir, names), encoding='utf-8') as f:
    table = {row['image_id']: row for row in csv.DictReader(f)}
  return images.reshape(n, kaggle.HEIGHT, kaggle.WIDTH), [table[i] for i in data.image_ids]


def _perturbed(tile, picks, rng):
  """Tile images `picks`, each shifted by up to (4, 6) px, with new paper noise: ink stays,
  the background takes values 236..255 as the real scans' grey paper does."""
  out = np.empty((len(picks), kaggle.HEIGHT, kaggle.WIDTH), np.uint8)
  for k, pick in enumerate(picks):
    out[k] = np.roll(tile[pick], (rng.integers(-4, 5), rng.integers(-6, 7)), axis=(0, 1))
  noise = rng.integers(0, 20, out.shape, np.uint8)
  np.minimum(out, 255 - noise, out=out)
  return out


def write(out_dir, num_train, num_test, tile=2000, seed=0, workers=None, log=print):
  """Writes the folder atomically (renamed into place when complete); returns seconds."""
  start = time.perf_counter()
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise FileExistsError(f'{out_dir} is not empty; choose a new --out (nothing was written)')
  rng = np.random.default_rng(seed)
  with tempfile.TemporaryDirectory() as tmp, files.atomic_dir(out_dir, durable=False) as out:
    tile_dir = os.path.join(tmp, 'tile')
    synth.write_dataset(tile_dir, tile, tile, seed=seed, workers=workers)
    for split, num in (('train', num_train), ('test', num_test)):
      images, labels = _read_tile(tile_dir, split)
      picks = rng.integers(0, len(images), num)
      prefix = 'Train' if split == 'train' else 'Test'
      ids = [f'{prefix}_{i}' for i in range(num)]
      for shard, part in enumerate(np.array_split(np.arange(num), kaggle.NUM_SHARDS)):
        kaggle.write_image_parquet(out / kaggle.image_parquet_name(split, shard),
                                   [ids[i] for i in part], _perturbed(images, picks[part], rng))
        log(f'{split} shard {shard}: {len(part):,} images, {time.perf_counter() - start:.0f} s')
      rows = [labels[p] for p in picks]
      columns = [*kaggle.COMPONENTS, 'grapheme']
      if split == 'train':
        write_train_tables(out, ids, rows)
      else:
        components = sorted(kaggle.COMPONENTS)
        test_rows = [(f'{i}_{c}', i, c) for i in ids for c in components]
        _write_csv(out / 'test.csv', kaggle.TEST_COLUMNS, test_rows)
        _write_csv(out / 'sample_submission.csv', ['row_id', 'target'],
                   [(row_id, 0) for row_id, _, _ in test_rows])
        _write_csv(out / 'test_labels.csv', [*kaggle.LABEL_COLUMNS, 'seen', 'font'],
                   [[i, *(r[c] for c in columns), r['seen'], r['font']]
                    for i, r in zip(ids, rows)])
    for name in ('class_map.csv', kaggle.CLASS_MAP_CORRECTED):
      shutil.copyfile(os.path.join(tile_dir, name), out / name)
  return time.perf_counter() - start


def write_train_tables(out, ids, rows):
  """train.csv, and train_multi_diacritics.csv (the March 2020 update: the rows of the
  reph + ra-phala graphemes, consonant class 7), from label rows (dicts) of the tile."""
  columns = [*kaggle.COMPONENTS, 'grapheme']
  _write_csv(out / 'train.csv', kaggle.LABEL_COLUMNS,
             [[i, *(r[c] for c in columns)] for i, r in zip(ids, rows)])
  _write_csv(out / kaggle.MULTI_DIACRITICS, kaggle.LABEL_COLUMNS,
             [[i, r['grapheme_root'], r['vowel_diacritic'], classes.REPH_RA_PHALA,
               r['grapheme']] for i, r in zip(ids, rows)
              if r['grapheme'] in classes.MULTI_DIACRITIC_GRAPHEMES])


def _write_csv(path, header, rows):
  with open(path, 'w', encoding='utf-8', newline='') as f:
    writer = csv.writer(f, lineterminator='\n')
    writer.writerow(header)
    writer.writerows(rows)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--train', type=int, default=KAGGLE_TRAIN_IMAGES)
  parser.add_argument('--test', type=int, default=KAGGLE_TRAIN_IMAGES)
  parser.add_argument('--tile', type=int, default=2000, help='rendered images per split')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  seconds = write(args.out, args.train, args.test, args.tile, args.seed)
  print(f'wrote {args.out} in {seconds:.0f} s')


if __name__ == '__main__':
  main()
