"""Fragments for the trainer: a HisFrag20 folder (or TFDS build) cut once into ink-centred
patches at native scale (retrieval/features/patches.py), kept in a memory-mapped cache, and endless
P x K batches (P classes, K patches each) for the metric-learning losses.

The cache holds only what training and evaluation read: binarised patches (1 byte a
pixel) and their SIFT descriptors, bounded by input.max_patches per fragment, instead of
every decoded pixel.
"""
import collections
import json
import os
import pathlib

import cv2
import jax
import numpy as np

from bengrapheme import cache, console, errors, inference, files, input as input_lib
from retrieval.collections import collection
from retrieval.features import lbp, patches, surrogate
from retrieval.fragments import reader

CACHE_LAYOUT = 3  # bump when the cache's files or the patch sampler change
# data.format of a scholar's own folder of images: any names, nested, no labels
# (retrieval/collections/collection.py); it trains with surrogate classes only and has no split to score.
COLLECTION = 'collection'


class PatchSource:
  """The ink-centred patches of one split (retrieval/features/patches.py), memory-mapped from the
  cache: record i = dict(image uint8 [S, S, 1] (ink 255), index). Per fragment f (row order of
  the split's listing): names[f], writer_ids[f], page_ids[f], valid_pixels[f] and its patches
  starts[f]:starts[f + 1]; patch_writer[i] is the writer of patch i."""

  def __init__(self, entry):
    self.path = pathlib.Path(entry)
    index = json.loads((self.path / 'index.json').read_text())
    self.names, self.size = index['names'], index['patch_size']
    self.writer_ids = np.array(index['writer'], np.int32)
    self.page_ids = np.array(index['page'], np.int32)
    self.starts = np.load(self.path / 'starts.npy')
    self.valid_pixels = np.load(self.path / 'valid_pixels.npy')
    self.fragment_of = np.repeat(np.arange(len(self.names)), np.diff(self.starts)).astype(np.int32)
    self.patch_writer = self.writer_ids[self.fragment_of]
    self._patches = None

  def __len__(self):
    return int(self.starts[-1])

  def patches(self):
    if self._patches is None:  # opened lazily: each grain worker maps the file itself
      self._patches = np.asarray(np.load(self.path / 'patches.npy', mmap_mode='r'))
    return self._patches

  def sift(self):
    """uint8 [len(self), 128]: the SIFT descriptor of each patch (a cache built with
    descriptors: the training split of a run with surrogate classes)."""
    return np.load(self.path / 'sift.npy', mmap_mode='r')

  def lbp(self):
    """float32 [len(self.names), 3072]: each fragment's SRS-LBP features (a cache built
    with eval.srs_lbp)."""
    return np.load(self.path / 'lbp.npy')

  def __getitem__(self, i):
    return dict(image=self.patches()[i][..., None], index=np.int32(i))

  def __getstate__(self):
    return dict(self.__dict__, _patches=None)

  def __repr__(self):
    return f'PatchSource({str(self.path)!r}: {len(self)} patches of {len(self.names)} fragments)'


class Rescaled:
  """read_rgb of a source with every fragment resized by `scale` (picklable, for the
  workers): the same hand as scanned at another resolution."""

  def __init__(self, src, scale):
    self.src, self.scale = src, scale

  def __call__(self, index):
    rgb = self.src.read_rgb(index)
    h, w = rgb.shape[:2]
    shape = (max(1, round(w * self.scale)), max(1, round(h * self.scale)))
    return cv2.resize(rgb, shape, interpolation=cv2.INTER_AREA if self.scale < 1
                      else cv2.INTER_LINEAR)


def _build(src, folder, params, lbp_from=None):
  """Extracts the patches of every fragment of a reader.FragmentSource into `folder`: each
  file decoded once in worker processes (retrieval/features/patches.py says where the rest runs). A bad fragment raises reader.DataError naming it, but for a
  collection's image (data.format='collection'), which is named and gets no patches. Patches
  (and, when asked, SIFT descriptors and SRS-LBP features) are appended to disk as they come,
  in fragment order, so memory holds only the fragments in flight, whatever the split's size.

  params['scales'] (absent: native only): a fragment's patches are those of the fragment
  resized by each scale, one after the other (input.scales, input.eval_scales). The other
  scales' patches are extracted first and held in memory (a demo's split: tens of MB);
  SRS-LBP and the fragment's area stay the native ones; lbp_from: a native entry whose
  SRS-LBP features are copied rather than computed again."""
  counts, valid = np.zeros(len(src), np.int64), np.zeros(len(src), np.int32)
  size, descriptors = params['patch_size'], params['descriptors']
  with_lbp = params['srs_lbp'] and lbp_from is None
  names = [os.path.basename(f.path) for f in src.fragments]
  cut = dict(size=size, max_patches=params['max_patches'], ink_bounds=params['ink_bounds'],
             seed=params['seed'], descriptors=descriptors, skip=(collection.Unreadable,))
  scales = params.get('scales', [1.0])
  other = [list(patches.extract_all(Rescaled(src, s), range(len(src)), names, **cut))
           for s in scales if s != 1.0]
  native = 1.0 in scales
  extracted = patches.extract_all(src.read_rgb, range(len(src)), names, with_lbp=with_lbp,
                                  **cut)
  raw = folder / 'patches.raw'
  lbp_rows = np.zeros((len(src), len(lbp.RADII) * lbp.NUM_BINS if with_lbp else 0), np.float32)
  with open(raw, 'wb') as out, open(folder / 'sift.raw', 'wb') as sift_out, \
      console.Progress(len(src), 'extracting patches', unit='fragment') as progress:
    for i, e in enumerate(extracted):
      if isinstance(e, str):  # a scholar's folder: the rest still trains
        console.say(f'Skipping {e}')
      else:
        kept = [e] * native + [o[i] for o in other if not isinstance(o[i], str)]
        counts[i], valid[i] = sum(len(k.patches) for k in kept), e.valid_pixels
        for k in kept:
          out.write(k.patches.tobytes())
          if descriptors:
            sift_out.write(k.sift.tobytes())
        if with_lbp:
          lbp_rows[i] = e.lbp
      progress.update()
  total = int(counts.sum())
  _raw_to_npy(raw, folder / 'patches.npy', (total, size, size))
  _raw_to_npy(folder / 'sift.raw', folder / 'sift.npy', (total if descriptors else 0, 128))
  np.save(folder / 'starts.npy', np.concatenate([[0], np.cumsum(counts)]))
  np.save(folder / 'valid_pixels.npy', valid)
  np.save(folder / 'lbp.npy', lbp_rows if lbp_from is None else PatchSource(lbp_from).lbp())
  (folder / 'index.json').write_text(json.dumps(
      {'names': [os.path.basename(x.path) for x in src.fragments], 'patch_size': size,
       'writer': src.writer_ids.tolist(), 'page': src.page_ids.tolist()}))


def _raw_to_npy(raw, path, shape):
  """Puts the .npy header in front of raw uint8 bytes (streamed, never all in memory)."""
  with open(path, 'wb') as out, open(raw, 'rb') as f:
    np.lib.format.write_array_header_1_0(
        out, {'descr': '|u1', 'fortran_order': False, 'shape': shape})
    while block := f.read(64 << 20):
      out.write(block)
  os.remove(raw)


def data_dir(config):
  if config.data.format == COLLECTION:
    if not config.data.dir:
      raise reader.DataError('no data: pass --data DIR (a folder of fragment images, any '
                             'names) or set config.data.dir')
    return config.data.dir
  return input_lib.data_dir(
      config, folder='a folder with train/ and test/ of WID_PID_FID.jpg fragments',
      error=reader.DataError)


class FragmentSubset(reader.FragmentSource):
  """The fragments `indices` of a reader.FragmentSource (a folder or a TFDS split), read
  through it: the val writers' fragments of train/, or train/ without them."""

  def __init__(self, src, indices):
    self.src, self.indices = src, np.asarray(indices, np.int64)
    super().__init__(src.folder, src.size, src.color, [src.fragments[i] for i in self.indices])
    self.record_files = getattr(src, 'record_files', None)

  def read_rgb(self, index):
    return self.src.read_rgb(int(self.indices[index]))


def val_writers(config, writers):
  """The writer ids (of train/) held out as the val split: a data.val_writers share of them,
  drawn by data.val_seed (apart from config.seed, so runs of any seed tune on the same
  writers). Disjoint from the training writers, as the test writers are."""
  writers = np.unique(writers)
  count = int(round(config.data.val_writers * len(writers)))
  if config.data.val_writers > 0:
    count = min(max(count, 1), len(writers) - 1)
  return set(np.random.default_rng(config.data.val_seed).permutation(writers)[:count].tolist())


def listing(config, split):
  """The split as a reader.FragmentSource (listed, nothing decoded yet): DATA/{split}, or the
  split of the TFDS build in config.data.tfds_dir (format 'tfds'). 'val' is the
  data.val_writers share of train/'s writers, and 'train' the rest."""
  # Only the listing and read_rgb (each fragment at its own size) are used: the fitted,
  # fixed-size records of reader.FragmentSource are not read here.
  if split not in ('train', 'val', 'test'):
    raise ValueError(f"split {split!r}: expected 'train', 'val' or 'test'")
  folder_split = 'train' if split == 'val' else split
  size, color = config.input.patch_size, False
  location = data_dir(config)
  if config.data.format == COLLECTION:
    if split != 'train':
      raise inference.Unlabelled(
          f"split {split!r}: a collection (data.format='collection') has no writer labels "
          'to score')
    return collection.CollectionSource(location, size, color)
  if config.data.format == 'tfds':
    # Imported only here: tensorflow_datasets takes ~0.5 s to import.
    from retrieval.fragments import tfds_hisfrag20
    src = tfds_hisfrag20.TfdsFragmentSource(location, folder_split, size, color)
  else:
    src = reader.FragmentSource(os.path.join(location, folder_split), size, color)
  if folder_split == 'test':
    return src
  held_out = val_writers(config, [f.writer for f in src.fragments])
  if split == 'val' and not held_out:
    raise ValueError('split \'val\' is empty: config.data.val_writers is 0; set it above 0 '
                     '(a share of the train/ writers) or leave val out of config.evals')
  in_val = np.array([f.writer in held_out for f in src.fragments])
  return FragmentSubset(src, np.flatnonzero(in_val if split == 'val' else ~in_val))


def source_files(config, src, split):
  """(the files the listing `src` of `split` is read from, their folder or build)."""
  if config.data.format == 'tfds':
    return src.record_files, config.data.tfds_dir
  return [f.path for f in src.fragments], src.folder


def patch_params(config, split):
  """The settings the patch cache of `split` depends on (part of its key): with SIFT
  descriptors for surrogate training, with SRS-LBP features for the splits scored."""
  i = config.input
  params = dict(layout=CACHE_LAYOUT, patch_size=i.patch_size, max_patches=i.max_patches,
                ink_bounds=list(i.ink_bounds), seed=config.seed,
                descriptors=split == 'train' and config.train.get('labels') == 'surrogate',
                srs_lbp=split != 'train' and bool(config.eval.get('srs_lbp')))
  scales = list(i.get('scales', [1.0]) if split == 'train' else i.get('eval_scales', [1.0]))
  if scales != [1.0]:  # only then: the caches of native patches keep their keys
    params['scales'] = scales
  return params


def source(config, workdir, split):
  """The patches of a split (train, val, test) of DATA or the TFDS build, extracted once into
  WORKDIR/prepared (or cache_dir): a bengrapheme/cache.py entry keyed by the fragment files
  (or the build's record files), patch_params and, for train and val, the val writers."""
  src = listing(config, split)
  paths, origin = source_files(config, src, split)
  params = patch_params(config, split)
  if split != 'test':  # a TFDS build's record files do not say which writers are val's
    params.update(val_writers=config.data.val_writers, val_seed=config.data.val_seed)

  def built(params, lbp_from=None):
    # Its own name with scales: an entry evicts only older ones of its name.
    name = f'patches-{split}' + ('-scales' if 'scales' in params else '')
    return cache.build_once(files.prepared_dir(config, workdir), name, paths,
                            params, lambda folder: _build(src, folder, params, lbp_from),
                            origin=origin)

  native = None
  if 'scales' in params and params['srs_lbp']:  # SRS-LBP from the native entry, built once
    native = built({k: v for k, v in params.items() if k != 'scales'})
  return PatchSource(built(params, native))


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
  averages (see retrieval/fragments/metrics.py).
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


def writers_and_per_writer(config):
  """(P, K) of the P x K global batches: train.batch_size must be a multiple of P."""
  p = config.train.writers_per_batch
  return p, config.train.batch_size // p


def check_data(config):
  """Fails fast (before the trainer takes its workdir) when the training folder is missing,
  empty or holds something other than WID_PID_FID.jpg fragments; a TFDS build is checked
  when it is opened."""
  if config.data.get('decisions') and (config.data.format != COLLECTION or
                                       config.train.labels != 'surrogate'):
    raise errors.ConfigError(f'data.decisions={config.data.decisions}: the workbench\'s '
                             'decisions train a collection with surrogate classes; use '
                             '--config configs/fragments.py:data=collection')
  if config.data.format == 'folder':
    reader.list_fragments(os.path.join(data_dir(config), 'train'))
  elif config.data.format == COLLECTION:
    collection.list_images(data_dir(config))


def train_data(config, workdir, local_batch):
  """This process's rows of each P x K global batch of patches; the iterator state
  checkpoints. Classes are writers (train.labels='writer') or surrogate classes, clusters of
  the patches' SIFT descriptors that need no writer labels (train.labels='surrogate')."""
  if config.train.labels == 'writer':
    check_training_writers(listing(config, 'train').fragments)
  src = source(config, workdir, 'train')
  labels = (src.patch_writer if config.train.labels == 'writer'
            else surrogate.labels(config, workdir, src))
  p, k = writers_and_per_writer(config)
  sampler = None
  if config.data.get('decisions'):  # the workbench's decisions beside the surrogate classes
    from retrieval.collections import learn
    root = data_dir(config)
    relative = [os.path.relpath(f.path, root).replace(os.sep, '/')
                for f in listing(config, 'train').fragments]
    labels, decided, partners = learn.snapshot(workdir, config.data.decisions, relative,
                                               src.fragment_of, labels)
    sampler = learn.DecisionBatches(labels, decided, partners, p, k, config.seed)
  return input_lib.train_stream(
      sampler or PKBatches(labels, p, k, config.seed),
      lambda idx: {'image': src.patches()[idx][..., None], 'label': labels[idx]},
      local_batch=local_batch, process_index=jax.process_index(),
      num_threads=config.input.num_threads)


def random_batch(config, local_batch):
  """Random patches with train_data's keys, shapes and dtypes, labelled P x K as its batches
  are (this process's rows): what launch.train --dry_run runs the train step on, without data."""
  rng = np.random.default_rng(config.seed)
  p, k = writers_and_per_writer(config)
  labels = np.repeat(np.arange(p, dtype=np.int32), k)
  lo = jax.process_index() * local_batch
  size = config.input.patch_size
  return dict(image=rng.integers(0, 256, (local_batch, size, size, 1), np.uint8),
              label=labels[lo:lo + local_batch])
