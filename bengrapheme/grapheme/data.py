"""Grapheme images for the trainer: the Kaggle folder (prepared once) or a TFDS build, split
into train / val (a seeded hold-out of train.csv) / test, as grain sources and batches."""
import jax

from bengrapheme import files, input as input_lib
from bengrapheme.grapheme import prepare


def _source(config, workdir, split):
  """Prepares (once, cached) and opens `split` ('train' or 'test') of config.data.dir, or
  opens it in the TFDS build in config.data.tfds_dir (format 'tfds'): the same records."""
  if config.data.format == 'tfds':
    if not config.data.tfds_dir:
      raise ValueError("config.data.format='tfds' needs config.data.tfds_dir, a TFDS data "
                       'dir holding a bengaliai build')
    # Imported only here: tensorflow_datasets takes ~0.5 s to import.
    from bengrapheme.grapheme import tfds_bengaliai
    return tfds_bengaliai.TfdsGraphemeSource(config.data.tfds_dir, split)
  if config.data.format != 'kaggle':
    raise ValueError(f"config.data.format={config.data.format!r}: expected 'kaggle' or 'tfds'")
  if not config.data.dir:
    raise ValueError('no data: pass --data DIR (a Kaggle bengaliai-cv19 folder) or set '
                     'config.data.dir')
  return prepare.GraphemeSource(
      prepare.prepare(config.data.dir, split, files.prepared_dir(config, workdir)))


def source(config, workdir, split):
  """'train' (minus the hold-out), 'val' (hold-out of train.csv) or 'test'."""
  if split == 'test':
    return _source(config, workdir, 'test')
  if split not in ('train', 'val'):
    raise ValueError(f"split {split!r}: expected 'train', 'val' or 'test'")
  train, val = input_lib.holdout_split(_source(config, workdir, 'train'),
                                       config.data.val_fraction, config.seed)
  if split == 'val' and len(val) == 0:
    raise ValueError("split 'val' is empty: set config.data.val_fraction > 0")
  return train if split == 'train' else val


def train_data(config, workdir, local_batch):
  """Shuffled, endless batches of this process's share of the training images."""
  return input_lib.train_dataset(
      source(config, workdir, 'train'), batch_size=local_batch, seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count(),
      num_threads=config.input.num_threads)
