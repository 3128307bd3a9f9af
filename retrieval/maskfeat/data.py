"""Training data of MaskFeat pre-training: random batches of the training split's patches
(retrieval/fragments/data.py's patch cache: ink-centred 32x32 binarised patches at native scale). No
labels are read, so a HisFrag20 folder, a TFDS build or a scholar's own collection
(data.format='collection') pre-train alike."""
import jax
import numpy as np

from bengrapheme import errors, input as input_lib
from retrieval.collections import collection
from retrieval.fragments import data


class RandomBatches:
  """Global batch b: batch_size distinct patches, a pure function of (seed, b)."""

  def __init__(self, count, batch_size, seed):
    if count < batch_size:
      raise errors.UserError(f'train.batch_size={batch_size}: the training images hold only '
                             f'{count:,} patches, and a batch takes distinct ones; lower it '
                             f'(--config.train.batch_size={count}) or add images')
    self.count, self.batch_size, self.seed = count, batch_size, seed

  def __len__(self):
    return 2**31 - 1  # endless; grain indexes batches by position

  def __getitem__(self, b):
    rng = np.random.default_rng([self.seed, b])
    return np.sort(rng.choice(self.count, self.batch_size, replace=False))


def check_data(config):
  """Fails fast when the training images are missing (no labels needed)."""
  if config.data.format == data.COLLECTION:
    collection.list_images(data.data_dir(config))
  else:
    data.check_data(config)


def train_data(config, workdir, local_batch):
  src = data.source(config, workdir, 'train')
  return input_lib.train_stream(
      RandomBatches(len(src), config.train.batch_size, config.seed),
      lambda idx: {'image': src.patches()[idx][..., None]},
      local_batch=local_batch, process_index=jax.process_index(),
      num_threads=config.input.num_threads)


def random_batch(config, local_batch):
  size = config.input.patch_size
  rng = np.random.default_rng(config.seed)
  return {'image': rng.integers(0, 256, (local_batch, size, size, 1), np.uint8)}
