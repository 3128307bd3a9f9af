"""Surrogate classes for training without writer labels (Christlein et al. 2017; Peer et al.
2023): the training patches' SIFT descriptors, Hellinger-normalised and PCA-whitened, are
clustered by k-means, and a patch's cluster is its class. Patches of one cluster share a
local shape (a letter part at one scale), so a metric learnt to tell clusters apart
describes handwriting, and any unlabelled collection can train it.

The labels are a bengrapheme/cache.py entry keyed by the patch cache and the clustering
settings, so a resumed run trains on exactly the same classes.
"""
import numpy as np
from sklearn.cluster import MiniBatchKMeans

from bengrapheme import cache, files
from retrieval.features import pca

PCA_DIMS = 32  # as Peer et al.: Hellinger-SIFT -> PCA-32 whitening -> k-means


def hellinger(descriptors):
  """SIFT [n, 128] -> RootSIFT (L1-normalised, square-rooted: Arandjelovic & Zisserman 2012)."""
  x = np.asarray(descriptors, np.float32)
  return np.sqrt(x / np.maximum(x.sum(axis=1, keepdims=True), 1e-12))


def cluster(descriptors, num_classes, seed):
  """int32 [n] cluster ids of SIFT descriptors [n, 128]."""
  x = hellinger(descriptors)
  x = pca.project(pca.fit(x, min(PCA_DIMS, len(x) - 1), whiten=True), x)
  kmeans = MiniBatchKMeans(num_classes, random_state=seed, batch_size=4096, n_init=3)
  return kmeans.fit_predict(x).astype(np.int32)


def labels(config, workdir, src):
  """The surrogate class of every patch of the training PatchSource `src`."""
  num_classes, seed = config.train.surrogate_classes, config.seed

  def build(folder):
    np.save(folder / 'labels.npy', cluster(src.sift(), num_classes, seed))

  entry = cache.build_once(files.prepared_dir(config, workdir), 'surrogates',
                           [src.path / 'sift.npy', src.path / 'index.json'],
                           [1, num_classes, PCA_DIMS, seed], build, origin=src.path)
  return np.load(entry / 'labels.npy')
