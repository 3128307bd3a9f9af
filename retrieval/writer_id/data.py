"""Writer identification's data: the fragment task's patch cache of train/ (retrieval/fragments/data.py),
split by page. Each writer with two or more pages has one of them, drawn by
data.heldout_seed, held out: the classifier must name the writer of a page it never saw, in
the same closed set of writers (classes: train/'s writers, in sorted order)."""
import os

import jax
import numpy as np

from bengrapheme import input as input_lib
from retrieval.fragments import data as fragment_data, reader


class Split:
  """The patches of one side of the page split: `patches` indices into `source` (the whole
  train/ cache), each patch's writer class `labels`, and per fragment (`fragments` indices
  into the source's fragments) its patches' positions `starts` within `patches`."""

  def __init__(self, source, fragments, fragment_class):
    self.source, self.fragments = source, fragments
    counts = np.diff(source.starts)[fragments]
    self.starts = np.concatenate([[0], np.cumsum(counts)])
    self.patches = np.concatenate(
        [np.arange(source.starts[f], source.starts[f + 1]) for f in fragments]).astype(np.int64)
    self.labels = fragment_class[source.fragment_of[self.patches]]
    self.fragment_labels = fragment_class[fragments]

  def __len__(self):
    return len(self.patches)

  def __getitem__(self, i):  # a record, as inference.outputs_by_row reads it
    return dict(image=self.source.patches()[self.patches[i]][..., None], index=np.int32(i))


def writers(config):
  """train/'s writer ids, sorted: class i is writers(config)[i]."""
  folder = os.path.join(fragment_data.data_dir(config), 'train')
  return sorted({f.writer for f in reader.list_fragments(folder)})


def splits(config, workdir):
  """{'train': Split, 'val': Split}: val the held-out page of each writer that has two."""
  # val_writers=0: every writer; the cache numbers them as writers(config) orders them.
  src = fragment_data.source(config, workdir, 'train')
  fragment_class = src.writer_ids
  rng = np.random.default_rng(config.data.heldout_seed)
  held_out = np.zeros(len(src.names), bool)
  for w in np.unique(src.writer_ids):
    pages = np.unique(src.page_ids[src.writer_ids == w])
    if len(pages) >= 2:
      held_out |= (src.writer_ids == w) & (src.page_ids == rng.choice(pages))
  return {'train': Split(src, np.flatnonzero(~held_out), fragment_class),
          'val': Split(src, np.flatnonzero(held_out), fragment_class)}


class RandomBatches:
  """protocols.Sampler: global batch b is `size` training patches drawn by (seed, b)."""

  def __init__(self, n, size, seed):
    self.n, self.size, self.seed = n, size, seed

  def __len__(self):
    return 2**31 - 1  # endless

  def __getitem__(self, b):
    return np.random.default_rng([self.seed, b]).integers(0, self.n, self.size)


def check_data(config):
  reader.list_fragments(os.path.join(fragment_data.data_dir(config), 'train'))


def train_data(config, workdir, local_batch):
  train = splits(config, workdir)['train']
  patches = train.source.patches
  return input_lib.train_stream(
      RandomBatches(len(train), config.train.batch_size, config.seed),
      lambda idx: {'image': patches()[train.patches[idx]][..., None],
                   'label': train.labels[idx]},
      local_batch=local_batch, process_index=jax.process_index(),
      num_threads=config.input.num_threads)


def random_batch(config, local_batch):
  rng = np.random.default_rng(config.seed)
  size = config.input.patch_size
  return dict(image=rng.integers(0, 256, (local_batch, size, size, 1), np.uint8),
              label=rng.integers(0, 2, local_batch).astype(np.int32))
