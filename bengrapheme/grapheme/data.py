"""Grapheme images for the trainer: the Kaggle folder (prepared once) or a TFDS build, split
into train / val / test, with rendered graphemes mixed into training, as grain sources and
batches.

val holds the real images of the held-out graphemes (unseen.py: never trained on, never
rendered), so model selection and the prediction rules see unseen graphemes in real
handwriting, plus a seeded fraction config.data.val_fraction of the other images.
"""
import json

import jax
import numpy as np

from bengrapheme import errors, files, input as input_lib
from bengrapheme.grapheme import classes, kaggle, prepare, rendered, unseen

CLASS_COUNTS = 'class_counts.json'


def _source(config, workdir, split):
  """Prepares (once, cached) and opens `split` ('train' or 'test') of config.data.dir, or
  opens it in the TFDS build in config.data.tfds_dir (format 'tfds'): the same records."""
  location = _data_dir(config)
  if config.data.format == 'tfds':
    if split == 'train' and config.data.corrected_labels:
      raise ValueError("config.data.corrected_labels reads train_multi_diacritics.csv from a "
                       "Kaggle folder (a TFDS build holds train.csv's labels): set "
                       "config.data.format='kaggle' or config.data.corrected_labels=False")
    # Imported only here: tensorflow_datasets takes ~0.5 s to import.
    from bengrapheme.grapheme import tfds_bengaliai
    return tfds_bengaliai.TfdsGraphemeSource(location, split)
  source = prepare.GraphemeSource(
      prepare.prepare(location, split, files.prepared_dir(config, workdir)))
  if split == 'train' and config.data.corrected_labels:
    return Relabelled(source, kaggle.corrected_labels(location, source.image_ids))
  return source


class Relabelled:
  """A source with some rows' labels replaced: {row: labels [3]} (the March 2020 update)."""

  def __init__(self, source, corrections):
    self.source = source
    self.labels = source.labels.copy()
    for row, labels in corrections.items():
      self.labels[row] = labels

  def __len__(self):
    return len(self.source)

  def __getitem__(self, index):
    return dict(self.source[index], labels=self.labels[int(index)].copy())

  def read_batch(self, rows, batch, at):
    input_lib.read_batch(self.source, rows, batch, at)
    batch['labels'][at] = self.labels[rows]


def source(config, workdir, split):
  """'train' (minus val), 'val' (held-out graphemes + a hold-out of images) or 'test'."""
  if split == 'test':
    return _source(config, workdir, 'test')
  if split not in ('train', 'val'):
    raise ValueError(f"split {split!r}: expected 'train', 'val' or 'test'")
  full = _source(config, workdir, 'train')
  _, val_triples = unseen.held_out(config)
  held = unseen.contains(val_triples, full.labels)
  rest = np.flatnonzero(~held)
  n_val = int(round(len(rest) * config.data.val_fraction))
  order = np.random.default_rng(config.seed).permutation(len(rest))
  val = np.sort(np.concatenate([np.flatnonzero(held), rest[order[:n_val]]]))
  if split == 'val':
    if len(val) == 0:
      raise ValueError("split 'val' is empty: set config.data.val_fraction > 0 or "
                       'config.unseen.val_graphemes > 0')
    return input_lib.Subset(full, val)
  return input_lib.Subset(full, np.sort(rest[order[n_val:]]))


def check_data(config):
  """Fails fast (before the trainer takes its workdir) when the Kaggle folder lacks a file
  the train split needs; their contents are checked when they are prepared, and a TFDS build
  when it is opened."""
  if config.data.format == 'kaggle':
    kaggle.source_files(_data_dir(config), 'train')


def _data_dir(config):
  return input_lib.data_dir(config, folder='a Kaggle bengaliai-cv19 folder',
                            error=kaggle.DataError)


def train_data(config, workdir, local_batch):
  """Shuffled, endless batches of this process's share of the training stream: real images,
  with rendered ones at config.render.fraction of every batch. Records the stream's class
  counts in the workdir, for the prior correction at prediction."""
  fraction = config.render.fraction
  real = source(config, workdir, 'train')
  mixed_in = rendered.source(config, files.prepared_dir(config, workdir)) if fraction else None
  if jax.process_index() == 0:
    counts = _stream_counts(real.labels, mixed_in.labels if fraction else None, fraction,
                            classes.num_classes(config.data.corrected_labels))
    files.write_atomic(files.join(workdir, CLASS_COUNTS), json.dumps(
        {name: c.tolist() for name, c in zip(kaggle.COMPONENTS, counts)}))
  return input_lib.train_dataset(
      real, batch_size=local_batch, seed=config.seed, process_index=jax.process_index(),
      process_count=jax.process_count(), num_threads=config.input.num_threads,
      mixed_in=mixed_in, mixed_fraction=fraction)


def random_batch(config, local_batch):
  """Random images and in-range labels with the keys, shapes and dtypes of train_data's
  batches: what launch.train --dry_run compiles and runs the train step on, without data."""
  rng = np.random.default_rng(config.seed)
  return dict(
      image=rng.integers(0, 256, (local_batch, kaggle.HEIGHT, kaggle.WIDTH), np.uint8),
      labels=np.stack([rng.integers(0, n, local_batch, np.int32)
                       for n in classes.num_classes(config.data.corrected_labels)], 1),
      grapheme=rng.integers(0, classes.NUM_GRAPHEMES, local_batch, np.int32),
      index=np.arange(local_batch, dtype=np.int32))


def _stream_counts(real_labels, rendered_labels, fraction, num_classes):
  """How many images of each class, per component, the training stream shows per len(real)
  images (the mixture's expected counts)."""
  def counts(labels):
    return [np.bincount(labels[:, i], minlength=n) for i, n in enumerate(num_classes)]
  real = counts(real_labels)
  if not fraction:
    return [r.astype(float) for r in real]
  n = len(real_labels)
  return [(1 - fraction) * r + fraction * n * d / d.sum()
          for r, d in zip(real, counts(rendered_labels))]


def class_counts(workdir):
  """The training stream's class counts (train_data wrote them): three float arrays."""
  path = files.join(workdir, CLASS_COUNTS)
  if not files.exists(path):
    raise errors.UserError(f'{path} not found: it is written when training starts; rerun the '
                           'launch.train command of this workdir (at its last step it writes '
                           'the file and trains no further)')
  counts = json.loads(files.read_text(path))
  return [np.asarray(counts[name], np.float64) for name in kaggle.COMPONENTS]
