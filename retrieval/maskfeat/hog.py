"""HOG targets of masked feature prediction (MaskFeat, Wei et al. 2022), as SAGHOG trains on
them (Peer et al. 2024; marco-peer/icdar24's utils/hoglayer.py, from MaskFeat's code).

Per pixel: Sobel gradients gx, gy of the image (reflect-padded by one pixel), magnitude
|g| and orientation bin floor(atan2(gx, gy) / pi * bins) mod bins (so a gradient and its
opposite share a bin: `bins` orientations over 180 degrees). Per cell of pool x pool pixels:
the histogram of the magnitudes over the bins, L2-normalised. Per token (a patch x patch
sub-patch of the model's input): its cells' histograms, concatenated. Written here in JAX
because the targets are computed on the device from each augmented batch; scikit-image's
hog (block normalisation, interpolated votes) is another descriptor.
"""
import jax.numpy as jnp
import numpy as np

# Sobel's x kernel (MaskFeat's weight_x); the y kernel is its transpose.
SOBEL_X = np.array([[1, 0, -1], [2, 0, -2], [1, 0, -1]], np.float32)


def dims(patch, pool, bins):
  """The length of one token's target."""
  return (patch // pool) ** 2 * bins


def targets(images, *, patch, pool=4, bins=9):
  """images [B, H, W] float -> [B, (H / patch) * (W / patch), dims(patch, pool, bins)], the
  tokens in row-major order (as models/vit.py's token map)."""
  if patch % pool:
    raise ValueError(f'maskfeat.hog_pool={pool} does not divide model.args.patch={patch}')
  batch, height, width = images.shape
  x = jnp.pad(images.astype(jnp.float32), ((0, 0), (1, 1), (1, 1)), mode='reflect')
  # Cross-correlation with the Sobel kernels (PyTorch's conv2d), as a [1, 2, 1] smoothing
  # then a difference: where the two sides are equal (the reflected border, flat ink) the
  # gradient is exactly 0, not a rounding residue whose sign would flip its bin (the bins
  # of +-180 degrees differ).
  rows = x[:, 0:height] + 2 * x[:, 1:height + 1] + x[:, 2:height + 2]  # [B, H, W + 2]
  cols = x[:, :, 0:width] + 2 * x[:, :, 1:width + 1] + x[:, :, 2:width + 2]  # [B, H + 2, W]
  gx = rows[:, :, 0:width] - rows[:, :, 2:width + 2]
  gy = cols[:, 0:height] - cols[:, 2:height + 2]
  magnitude = jnp.sqrt(gx ** 2 + gy ** 2)
  bin_index = jnp.mod(jnp.floor(jnp.arctan2(gx, gy) / jnp.pi * bins), bins).astype(jnp.int32)
  votes = (bin_index[..., None] == jnp.arange(bins)) * magnitude[..., None]  # [B, H, W, bins]
  cells = votes.reshape(batch, height // pool, pool, width // pool, pool, bins).sum((2, 4))
  cells = cells / jnp.maximum(jnp.linalg.norm(cells, axis=-1, keepdims=True), 1e-12)
  per = patch // pool  # cells along a token's side
  tokens = cells.reshape(batch, height // patch, per, width // patch, per, bins)
  return tokens.transpose(0, 1, 3, 2, 4, 5).reshape(
      batch, (height // patch) * (width // patch), per * per * bins)
