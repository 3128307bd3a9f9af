"""Fragment retrieval as the trainer sees it: P x K batches, encoder, triplet loss, evaluator.

Fragments are decoded and fitted once into a memory-mapped cache (JPEG decoding every epoch
would starve 2 CPU cores); the device does the random crop, augmentation and normalisation.
"""
import collections
import concurrent.futures
import functools
import hashlib
import json
import os
import shutil
import tempfile

import grain
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from bengrapheme import augment, files, input as input_lib, models, parallel
from retrieval import lbp, metrics as retrieval_metrics, reader

# ---------------------------------------------------------------- data


class CachedFragments:
  """All fragments of one split, fitted to `size` and stored as one uint8 memmap."""

  def __init__(self, path, names, writer, page, valid_pixels):
    self.path, self.names = path, names
    self.writer_ids, self.page_ids, self.valid_pixels = writer, page, valid_pixels
    self._images = None

  def __len__(self):
    return len(self.names)

  def __getitem__(self, i):
    if self._images is None:  # opened lazily: each grain worker maps the file itself
      self._images = np.load(self.path, mmap_mode='r')
    return dict(image=np.asarray(self._images[i]), writer=self.writer_ids[i],
                page=self.page_ids[i], index=np.int32(i), valid_pixels=self.valid_pixels[i])

  def __getstate__(self):
    return dict(self.__dict__, _images=None)


def _cache_key(paths, size, color):
  """From the files the fragments are read from: fragment files, or a TFDS build's records."""
  digest = hashlib.sha256(f'{size} {color}'.encode())
  for path in paths:
    stat = os.stat(path)
    digest.update(f'{os.path.basename(path)} {stat.st_size} {stat.st_mtime_ns}\n'.encode())
  return digest.hexdigest()[:16]


def _build_cache(src, out_dir):
  """Decodes and fits every fragment of a reader.FragmentSource (in threads; Pillow releases
  the GIL) into out_dir."""
  size, color = src.size, src.color
  tmp = out_dir + f'.tmp-{os.getpid()}'
  os.makedirs(tmp, exist_ok=True)
  images = np.lib.format.open_memmap(os.path.join(tmp, 'images.npy'), 'w+', np.uint8,
                                     (len(src), size, size, 3 if color else 1))
  valid = np.zeros(len(src), np.int32)

  def fill(i):
    record = src[i]
    images[i], valid[i] = record['image'], record['valid_pixels']

  try:  # a bad fragment (reader.DataError names it) leaves no half-built cache behind
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
      list(pool.map(fill, range(len(src))))
    images.flush()
    np.save(os.path.join(tmp, 'valid_pixels.npy'), valid)
    with open(os.path.join(tmp, 'index.json'), 'w') as f:
      json.dump({'names': [os.path.basename(x.path) for x in src.fragments],
                 'writer': src.writer_ids.tolist(), 'page': src.page_ids.tolist()}, f)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  os.replace(tmp, out_dir)  # complete or absent, never half-written


def _folder(config, split):
  if not config.data.dir:
    raise ValueError('no data: pass --data DIR (a folder with train/ and test/ of '
                     'WID_PID_FID.jpg fragments) or set config.data.dir')
  return os.path.join(config.data.dir, split)


def _fragment_source(config, split):
  """The split as a reader.FragmentSource (listed, nothing decoded yet): DATA/{split}, or the
  split of the TFDS build in config.data.tfds_dir (format 'tfds')."""
  size, color = config.input.load_size, config.input.color
  if config.data.format == 'tfds':
    if not config.data.tfds_dir:
      raise ValueError("config.data.format='tfds' needs config.data.tfds_dir, a TFDS data "
                       'dir holding a hisfrag20 build')
    # Imported only here: tensorflow_datasets takes ~0.5 s to import.
    from retrieval import tfds_hisfrag20
    return tfds_hisfrag20.TfdsFragmentSource(config.data.tfds_dir, split, size, color)
  if config.data.format != 'folder':
    raise ValueError(f"config.data.format={config.data.format!r}: expected 'folder' or 'tfds'")
  return reader.FragmentSource(_folder(config, split), size, color)


def source(config, workdir, split):
  """The fragments of DATA/{train,test} (or of the TFDS build), decoded once into
  WORKDIR/prepared (or cache_dir)."""
  src = _fragment_source(config, split)
  paths = (src.record_files if config.data.format == 'tfds'
           else [f.path for f in src.fragments])
  key = _cache_key(paths, src.size, src.color)
  cache = files.prepared_dir(config, workdir)
  out_dir = os.path.join(cache, f'fragments-{split}-{key}')
  if jax.process_index() == 0 and not os.path.isdir(out_dir):
    os.makedirs(cache, exist_ok=True)
    _build_cache(src, out_dir)
  multihost_utils.sync_global_devices(f'fragments cache {split}')
  if not os.path.isdir(out_dir):  # another host, with a cache dir of its own
    _build_cache(src, out_dir)
  with open(os.path.join(out_dir, 'index.json')) as f:
    index = json.load(f)
  return CachedFragments(os.path.join(out_dir, 'images.npy'), index['names'],
                         np.array(index['writer'], np.int32), np.array(index['page'], np.int32),
                         np.load(os.path.join(out_dir, 'valid_pixels.npy')))


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
  averages (see retrieval/metrics.py).
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


def train_data(config, workdir, local_batch):
  """This process's rows of each P x K global batch; the iterator state checkpoints."""
  check_training_writers(_fragment_source(config, 'train').fragments)
  src = source(config, workdir, 'train')
  p, k = config.train.writers_per_batch, config.train.batch_size // config.train.writers_per_batch
  if p * k != config.train.batch_size:
    raise ValueError(f'train.batch_size={config.train.batch_size} must be a multiple of '
                     f'train.writers_per_batch={p}')
  lo = jax.process_index() * local_batch
  sampler = PKBatches(src.writer_ids, p, k, config.seed)
  ds = grain.MapDataset.source(sampler).map(lambda idx: idx[lo:lo + local_batch])
  ds = ds.map(lambda idx: {key: np.stack([src[int(i)][key] for i in idx])
                           for key in ('image', 'writer', 'page')})
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=config.input.num_threads,
                                              prefetch_buffer_size=4))


# ---------------------------------------------------------------- model


class FragmentEncoder(nnx.Module):
  """Backbone feature map -> GeM (or NetVLAD) pooling -> projection -> L2 normalisation."""

  def __init__(self, config, rngs):
    m = config.model
    channels = 3 if config.input.color else 1
    self.backbone = models.backbone(m.name, in_channels=channels, pool='none', rngs=rngs,
                                    **m.args)
    features = self.backbone.features
    self.pooling = m.pooling
    if m.pooling == 'gem':  # generalised mean; p is learnt (Radenovic et al. 2018)
      self.gem_p = nnx.Param(jnp.array(3.0))
      pooled = features
    elif m.pooling == 'netvlad':  # Arandjelovic et al. 2016
      self.assign = nnx.Linear(features, m.netvlad_clusters, rngs=rngs)
      self.centres = nnx.Param(
          jax.random.normal(rngs.params(), (m.netvlad_clusters, features)) * 0.1)
      pooled = features * m.netvlad_clusters
    else:
      raise ValueError(f"model.pooling={m.pooling!r}: expected 'gem' or 'netvlad'")
    self.projection = nnx.Linear(pooled, m.embedding_dim, rngs=rngs)

  def __call__(self, x, train=False):
    fmap = self.backbone(x, train=train).astype(jnp.float32)  # [B, h, w, F]
    if self.pooling == 'gem':
      p = jnp.maximum(self.gem_p[...], 1.0)
      pooled = jnp.mean(jnp.maximum(fmap, 1e-6) ** p, axis=(1, 2)) ** (1.0 / p)
    else:
      flat = fmap.reshape(fmap.shape[0], -1, fmap.shape[-1])  # [B, n, F]
      soft = jax.nn.softmax(self.assign(flat), -1)  # [B, n, K]
      residuals = jnp.einsum('bnk,bnf->bkf', soft, flat) - (
          soft.sum(1)[..., None] * self.centres[...][None])
      residuals = residuals / (jnp.linalg.norm(residuals, axis=-1, keepdims=True) + 1e-6)
      pooled = residuals.reshape(residuals.shape[0], -1)
      pooled = pooled / (jnp.linalg.norm(pooled, axis=-1, keepdims=True) + 1e-6)
    embedding = self.projection(pooled)
    return embedding / (jnp.linalg.norm(embedding, axis=-1, keepdims=True) + 1e-6)


def make_model(config, rngs):
  return FragmentEncoder(config, rngs)


def preprocess(images, config, key=None):
  """uint8 [B, S, S, C] -> float32 in [0, 1]: a random crop_size crop when `key` (training),
  else the whole fitted fragment (the encoder is fully convolutional up to its pooling)."""
  x = images.astype(jnp.float32) / 255.0
  crop, size = config.input.crop_size, images.shape[1]
  if key is None:
    return x
  offsets = jax.random.randint(key, (x.shape[0], 2), 0, size - crop + 1)
  return jax.vmap(lambda im, o: jax.lax.dynamic_slice(
      im, (o[0], o[1], 0), (crop, crop, im.shape[-1])))(x, offsets)


# ---------------------------------------------------------------- loss


def pairwise_distances(embeddings):
  """Euclidean distances [B, B] of L2-normalised embeddings, with a stable zero diagonal."""
  sq = jnp.maximum(2.0 - 2.0 * embeddings @ embeddings.T, 0.0)
  return jnp.sqrt(sq + 1e-12) * (1.0 - jnp.eye(embeddings.shape[0]))


def batch_hard_triplet_loss(embeddings, labels, margin):
  """Hermans et al. 2017: per anchor, its hardest positive against its hardest negative.

  `margin` None -> the soft margin log(1 + exp(d_ap - d_an)). Anchors without a positive or
  a negative in the batch are left out.
  """
  d = pairwise_distances(embeddings)
  same = labels[:, None] == labels[None, :]
  positive = same & ~jnp.eye(len(labels), dtype=bool)
  hardest_pos = jnp.max(jnp.where(positive, d, -jnp.inf), axis=1)
  hardest_neg = jnp.min(jnp.where(same, jnp.inf, d), axis=1)
  valid = positive.any(1) & (~same).any(1)
  gap = jnp.where(valid, hardest_pos - hardest_neg, 0.0)
  per_anchor = jax.nn.softplus(gap) if margin is None else jax.nn.relu(gap + margin)
  return jnp.sum(jnp.where(valid, per_anchor, 0.0)) / jnp.maximum(valid.sum(), 1)


def multi_similarity_loss(embeddings, labels, alpha=2.0, beta=50.0, lam=0.5, epsilon=0.1):
  """Wang et al. 2019 with its pair mining, on cosine similarities."""
  s = embeddings @ embeddings.T
  same = labels[:, None] == labels[None, :]
  positive = same & ~jnp.eye(len(labels), dtype=bool)
  negative = ~same
  # Mining: keep negatives harder than the easiest positive (+eps), positives harder than
  # the hardest negative (-eps).
  min_pos = jnp.min(jnp.where(positive, s, jnp.inf), 1, keepdims=True)
  max_neg = jnp.max(jnp.where(negative, s, -jnp.inf), 1, keepdims=True)
  neg_kept = negative & (s + epsilon > min_pos)
  pos_kept = positive & (s - epsilon < max_neg)
  pos_term = jnp.log1p(jnp.sum(jnp.where(pos_kept, jnp.exp(-alpha * (s - lam)), 0.0), 1)) / alpha
  neg_term = jnp.log1p(jnp.sum(jnp.where(neg_kept, jnp.exp(beta * (s - lam)), 0.0), 1)) / beta
  valid = positive.any(1) & negative.any(1)
  return jnp.sum(jnp.where(valid, pos_term + neg_term, 0.0)) / jnp.maximum(valid.sum(), 1)


def loss(model, batch, key, config):
  """Metric-learning loss over the whole global batch (jit sees it across all devices)."""
  crop_key, aug_key = jax.random.split(key)
  images = preprocess(batch['image'], config, crop_key)
  images, _ = augment.apply(aug_key, images, (), config.aug)
  embeddings = model(images, train=True)
  labels = batch['writer']
  if config.loss.name == 'batch_hard':
    value = batch_hard_triplet_loss(embeddings, labels, config.loss.margin)
  elif config.loss.name == 'multi_similarity':
    value = multi_similarity_loss(embeddings, labels)
  else:
    raise ValueError(f"loss.name={config.loss.name!r}: expected 'batch_hard' or "
                     "'multi_similarity'")
  d = pairwise_distances(embeddings)
  same = labels[:, None] == labels[None, :]
  # How often the hardest negative is closer than the hardest positive: a training signal
  # that does not depend on the loss's scale.
  violated = (jnp.max(jnp.where(same & ~jnp.eye(len(labels), dtype=bool), d, -jnp.inf), 1) >
              jnp.min(jnp.where(same, jnp.inf, d), 1))
  return value, {'hard_violations': violated.mean()}


# ---------------------------------------------------------------- evaluator


def embed(config, split, graphdef, variables, mesh, workdir):
  """Embeddings [N, D] of every fragment of `split`, in the source's order, plus the source."""
  src = source(config, workdir, split)

  @functools.partial(jax.jit, out_shardings=parallel.replicated(mesh))
  def forward(batch):
    model = nnx.merge(graphdef, *variables)
    return model(preprocess(batch['image'], config), train=False), batch['index'], batch['mask']

  local_batch = parallel.per_process_batch(config.eval.batch_size, mesh)
  outputs = [forward(parallel.global_batch(mesh, {k: b[k] for k in ('image', 'index', 'mask')}))
             for b in input_lib.eval_batches(src, batch_size=local_batch,
                                             process_index=jax.process_index(),
                                             process_count=jax.process_count())]
  embeddings = np.zeros((len(src), config.model.embedding_dim), np.float32)
  for e, index, mask in jax.device_get(outputs):
    embeddings[index[mask]] = e[mask]
  return embeddings, src


def _labelings(src):
  return {'writer': src.writer_ids, 'page': src.page_ids}


def lbp_features(src, indices):
  """SRS-LBP features of fragments `indices` of a reader.FragmentSource, at their own
  resolution (threads: numpy frees the GIL)."""
  def one(i):
    return lbp.lbp_features(reader.convert(src.read_rgb(i), color=False))

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    return np.stack(list(pool.map(one, indices)))


def srs_lbp(config, workdir):
  """The SRS-LBP baseline on the test split (PCA fitted on train): (metrics, embeddings
  [N, 200]), cached in the workdir (the embeddings feed report.html's per-query charts)."""
  json_path = files.join(workdir, 'eval', 'srs_lbp.json')
  npy_path = files.join(workdir, 'eval', 'srs_lbp_test.npy')
  if files.exists(json_path) and files.exists(npy_path):
    return json.loads(files.read_text(json_path)), files.load_npy(npy_path)
  # The listings in the order of the caches (which source() builds from them), so row i of
  # the features is fragment i of test_src; read from the folder or the TFDS build alike.
  train_list, test_list = _fragment_source(config, 'train'), _fragment_source(config, 'test')
  test_src = source(config, workdir, 'test')
  fit_on = np.random.default_rng(config.seed).permutation(len(train_list))
  train_features = lbp_features(train_list, fit_on[:config.eval.lbp_fit_fragments])
  test_features = lbp_features(test_list, range(len(test_list)))
  pca = lbp.fit_pca(train_features, dim=min(200, *train_features.shape))
  embeddings = lbp.embed(pca, test_features)
  report = retrieval_metrics.retrieval_metrics(embeddings, _labelings(test_src),
                                               metric='cityblock')
  if jax.process_index() == 0:
    files.save_npy(npy_path, embeddings)
    files.write_atomic(json_path, json.dumps(report))
  return report, embeddings


def evaluate(config, split, graphdef, variables, mesh, workdir, details=None):
  """Writer and page retrieval metrics of the encoder (and SRS-LBP when configured).

  A `details` dict, when given, receives what retrieval/report.py shows: `source` and
  `embeddings` {method: (embeddings [N, d], the metric they are ranked by)}.
  """
  embeddings, src = embed(config, split, graphdef, variables, mesh, workdir)
  report = {'encoder': retrieval_metrics.retrieval_metrics(embeddings, _labelings(src))}
  ranked_by = {'encoder': (embeddings, 'euclidean')}  # retrieval_metrics' default metric
  if config.eval.pca_whitening and split != 'train':  # fitted on the training embeddings
    train_embeddings, _ = embed(config, 'train', graphdef, variables, mesh, workdir)
    whitening = retrieval_metrics.fit_pca_whitening(train_embeddings, config.eval.pca_whitening)
    report['encoder_whitened'] = retrieval_metrics.retrieval_metrics(
        retrieval_metrics.apply_pca_whitening(whitening, embeddings), _labelings(src))
  if config.eval.srs_lbp and split == 'test':
    report['srs_lbp'], lbp_embeddings = srs_lbp(config, workdir)
    ranked_by['srs_lbp'] = (lbp_embeddings, 'cityblock')
  if config.eval.export_distances and jax.process_index() == 0:
    distances = retrieval_metrics.distance_matrix(embeddings)
    files.save_npy(files.join(workdir, 'eval', f'distances_{split}.npy'), distances)
    # N x N as text is large (~4 GB at 20k): written locally first, then moved into place.
    with tempfile.TemporaryDirectory() as tmp:
      local = os.path.join(tmp, 'distances.csv')
      retrieval_metrics.write_distance_csv(local, distances, src.names)
      files.copy_in(local, files.join(workdir, 'eval', f'distances_{split}.csv'))
  if details is not None:
    details.update(source=src, embeddings=ranked_by)
  flat = {f'{method}/{labeling}/{k}': v for method, block in report.items()
          for labeling, scores in block.items() for k, v in scores.items()}
  flat['score'] = report['encoder']['writer']['map']
  return flat
