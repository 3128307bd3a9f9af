"""PCA of embeddings or features, fitted on the training split, plain or whitened.

One implementation for the SRS-LBP baseline (3,072-d histograms to 200 dims, centred, not
whitened) and the encoder's optional PCA-whitening: float64 SVD, axis signs fixed (the
largest-magnitude coefficient positive) so that refits give the same projection.
"""
from typing import NamedTuple

import numpy as np


class PCA(NamedTuple):
  mean: np.ndarray  # [D]
  components: np.ndarray  # [dim, D], rows = principal axes, largest variance first
  scale: np.ndarray  # [dim]: 1, or 1 / sqrt(variance + eps) when whitened


def fit(x, dim, *, whiten=False, eps=1e-6):
  """PCA of training rows x [n, D] keeping `dim` axes (1 <= dim <= min(n - 1, D))."""
  x = np.asarray(x, np.float64)
  if x.ndim != 2:
    raise ValueError(f'PCA input must be [n, D], got shape {x.shape}')
  limit = min(x.shape[0] - 1, x.shape[1])
  if not 1 <= dim <= limit:
    raise ValueError(f'dim must be in [1, min(n - 1, D)] = [1, {limit}], got {dim}')
  mean = x.mean(axis=0)
  _, singular, vt = np.linalg.svd(x - mean, full_matrices=False)
  axes = vt[:dim]
  axes *= np.sign(axes[np.arange(dim), np.abs(axes).argmax(axis=1)])[:, None]
  variance = singular[:dim] ** 2 / (x.shape[0] - 1)
  scale = 1 / np.sqrt(variance + eps) if whiten else np.ones(dim)
  return PCA(mean.astype(np.float32), axes.astype(np.float32), scale.astype(np.float32))


def project(pca, x):
  """Rows x [N, D] -> float32 [N, dim] on the principal axes (whitened if fitted so)."""
  return (np.asarray(x, np.float32) - pca.mean) @ pca.components.T * pca.scale


def l2_normalise(y):
  return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), np.finfo(np.float32).tiny)
