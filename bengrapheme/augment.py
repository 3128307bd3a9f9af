"""On-device augmentation for batches of handwriting images, jitted with the train step.

Images are float32 [B, H, W, C] with ink high and paper 0 (the model input is
(255 - pixel) / 255), so every fill below is 0: blank paper. Each function takes a
`jax.random` key and draws its own parameters for every image of the batch; config values
are static Python numbers, so a stage that is switched off costs nothing in the jitted step.
"""

import jax
import jax.numpy as jnp


def apply(key, images, targets, aug):
  """Runs the stages switched on in `aug`: affine, cutout, RandomErasing, GridMask, then
  MixUp/CutMix.

  `aug` has the fields of `defaults.augmentation()`; `targets` is a tuple of float one-hot or
  soft label arrays [B, K_i]. Returns (images, targets).
  """
  affine_key, cutout_key, erase_key, grid_key, mix_key = jax.random.split(key, 5)
  if aug.affine:
    images = random_affine(affine_key, images, rotate_deg=aug.rotate_deg,
                           shear_deg=aug.shear_deg, scale=tuple(aug.scale),
                           translate=aug.translate)
  if aug.cutout_prob > 0:
    images = cutout(cutout_key, images, size_fraction=aug.cutout_size, prob=aug.cutout_prob)
  if aug.erase_prob > 0:
    images = random_erasing(erase_key, images, prob=aug.erase_prob, area=tuple(aug.erase_area))
  if aug.grid_mask_prob > 0:
    images = grid_mask(grid_key, images, prob=aug.grid_mask_prob)
  if aug.mix_prob > 0:
    images, targets = mix(mix_key, images, targets, mixup_alpha=aug.mixup_alpha,
                          cutmix_alpha=aug.cutmix_alpha, prob=aug.mix_prob)
  return images, tuple(targets)


# ---------------------------------------------------------------------------------------------
# Geometry.


def _pixel_axes(height, width):
  """Row and column coordinates [1, H, 1] and [1, 1, W]: masks built from them broadcast
  over the batch, and each comparison runs once per row or column, not per pixel."""
  return (jnp.arange(height, dtype=jnp.float32)[None, :, None],
          jnp.arange(width, dtype=jnp.float32)[None, None, :])


def _bilinear(image, ys, xs):
  """Samples image [H, W, C] at float coordinates ys, xs [H', W'], 0 outside the image.

  A hand-written gather rather than `jax.scipy.ndimage.map_coordinates`: on CPU (B=64,
  128x128) the two tie for one channel (2-4 ms each) and this is 1.3-1.5x faster for three,
  because the corner indices and weights are computed once for all channels.
  """
  height, width = image.shape[:2]
  y0, x0 = jnp.floor(ys), jnp.floor(xs)
  wy, wx = ys - y0, xs - x0
  y0, x0 = y0.astype(jnp.int32), x0.astype(jnp.int32)
  out = jnp.zeros(ys.shape + image.shape[2:], image.dtype)
  for dy, weight_y in ((0, 1 - wy), (1, wy)):
    for dx, weight_x in ((0, 1 - wx), (1, wx)):
      y, x = y0 + dy, x0 + dx
      inside = (y >= 0) & (y < height) & (x >= 0) & (x < width)
      weight = jnp.where(inside, weight_y * weight_x, 0).astype(image.dtype)
      corner = image[jnp.clip(y, 0, height - 1), jnp.clip(x, 0, width - 1)]
      out = out + corner * weight[..., None]
  return out


def affine_transform(images, angle_deg, shear_deg, scale, translate):
  """Warps each image about its centre by its own parameters.

  The forward map is p -> scale * R(angle) @ Shear(shear) @ (p - centre) + centre + translate;
  a positive angle turns the ink counter-clockwise as displayed (y down), a positive shear
  slants it to the right going down.

  Args:
    images: [B, H, W, C].
    angle_deg, shear_deg, scale: [B].
    translate: [B, 2] shift (dy, dx) in pixels.
  """
  height, width = images.shape[1:3]
  angle, shear = jnp.deg2rad(angle_deg), jnp.deg2rad(shear_deg)
  cos, sin, tan = [v[:, None, None] for v in (jnp.cos(angle), jnp.sin(angle), jnp.tan(shear))]
  scale = scale[:, None, None]
  centre_y, centre_x = (height - 1) / 2, (width - 1) / 2
  y, x = _pixel_axes(height, width)
  dy = y - centre_y - translate[:, 0, None, None]
  dx = x - centre_x - translate[:, 1, None, None]
  # Sampling needs the inverse map, output pixel -> source pixel. In (y, x) order
  # R = [[cos, -sin], [sin, cos]] and Shear = [[1, 0], [tan, 1]], so the inverse is
  # Shear^-1 @ R^-1 / scale = [[cos, sin], [-tan cos - sin, cos - tan sin]] / scale.
  src_y = (cos * dy + sin * dx) / scale + centre_y
  src_x = ((-tan * cos - sin) * dy + (cos - tan * sin) * dx) / scale + centre_x
  return jax.vmap(_bilinear)(images, src_y, src_x)


def random_affine(key, images, *, rotate_deg, shear_deg, scale, translate):
  """Random rotation in [-rotate_deg, rotate_deg], shear in [-shear_deg, shear_deg], scale in
  [scale[0], scale[1]] and shift up to `translate` times the image size on each axis."""
  batch, height, width = images.shape[:3]
  angle_key, shear_key, scale_key, shift_key = jax.random.split(key, 4)
  angle = jax.random.uniform(angle_key, (batch,), minval=-rotate_deg, maxval=rotate_deg)
  shear = jax.random.uniform(shear_key, (batch,), minval=-shear_deg, maxval=shear_deg)
  zoom = jax.random.uniform(scale_key, (batch,), minval=scale[0], maxval=scale[1])
  shift = jax.random.uniform(shift_key, (batch, 2), minval=-translate, maxval=translate)
  return affine_transform(images, angle, shear, zoom, shift * jnp.array([height, width]))


# ---------------------------------------------------------------------------------------------
# Erasing.


def cutout(key, images, *, size_fraction, prob):
  """With probability `prob` per image, blanks a rectangle of `size_fraction` of the image's
  height and width centred at a uniform random pixel (it may reach over the border)."""
  batch, height, width = images.shape[:3]
  apply_key, y_key, x_key = jax.random.split(key, 3)
  hole_h, hole_w = round(size_fraction * height), round(size_fraction * width)
  top = jax.random.randint(y_key, (batch, 1, 1), 0, height) - hole_h // 2
  left = jax.random.randint(x_key, (batch, 1, 1), 0, width) - hole_w // 2
  y, x = _pixel_axes(height, width)
  hole = (y >= top) & (y < top + hole_h) & (x >= left) & (x < left + hole_w)
  hole &= jax.random.bernoulli(apply_key, prob, (batch, 1, 1))
  return jnp.where(hole[..., None], jnp.zeros((), images.dtype), images)


def random_erasing(key, images, *, prob, area=(0.02, 0.33), aspect=(0.3, 3.3)):
  """RandomErasing (Zhong et al. 2020): with probability `prob` per image, fills a rectangle
  with uniform noise. Its area is a uniform fraction in `area` of the image and its aspect
  ratio log-uniform in `aspect`, clipped to the image; it lies wholly inside the image."""
  batch, height, width = images.shape[:3]
  apply_key, area_key, aspect_key, pos_key, noise_key = jax.random.split(key, 5)
  fraction = jax.random.uniform(area_key, (batch, 1, 1), minval=area[0], maxval=area[1])
  ratio = jnp.exp(jax.random.uniform(aspect_key, (batch, 1, 1), minval=jnp.log(aspect[0]),
                                     maxval=jnp.log(aspect[1])))
  hole_h = jnp.minimum(jnp.round(jnp.sqrt(fraction * height * width * ratio)), height)
  hole_w = jnp.minimum(jnp.round(jnp.sqrt(fraction * height * width / ratio)), width)
  corner = jax.random.uniform(pos_key, (2, batch, 1, 1))
  top = jnp.floor(corner[0] * (height - hole_h + 1))
  left = jnp.floor(corner[1] * (width - hole_w + 1))
  y, x = _pixel_axes(height, width)
  hole = (y >= top) & (y < top + hole_h) & (x >= left) & (x < left + hole_w)
  hole &= jax.random.bernoulli(apply_key, prob, (batch, 1, 1))
  noise = jax.random.uniform(noise_key, images.shape, images.dtype)
  return jnp.where(hole[..., None], noise, images)


def grid_mask(key, images, *, prob, ratio=0.5, period=(0.2, 0.5)):
  """GridMask (Chen et al. 2020): with probability `prob` per image, blanks a grid of square
  holes. Each image draws its period d uniformly in `period` times its shorter side and a
  random offset in [0, d) on each axis; every hole has side `ratio` * d, so about a fraction
  ratio**2 of the image is erased (the paper's keep ratio r is 1 - ratio)."""
  batch, height, width = images.shape[:3]
  apply_key, period_key, offset_key = jax.random.split(key, 3)
  side = min(height, width)
  d = jax.random.uniform(period_key, (batch, 1, 1), minval=period[0] * side,
                         maxval=period[1] * side)
  offset = jax.random.uniform(offset_key, (2, batch, 1, 1)) * d
  y, x = _pixel_axes(height, width)
  hole = (jnp.mod(y - offset[0], d) < ratio * d) & (jnp.mod(x - offset[1], d) < ratio * d)
  hole &= jax.random.bernoulli(apply_key, prob, (batch, 1, 1))
  return jnp.where(hole[..., None], jnp.zeros((), images.dtype), images)


# ---------------------------------------------------------------------------------------------
# Mixing.


def mix(key, images, targets, *, mixup_alpha, cutmix_alpha, prob):
  """MixUp or CutMix of each image with its partner in a random permutation of the batch.

  With probability `prob` the whole batch is mixed, by MixUp or CutMix (a coin flip when both
  alphas are > 0; an alpha of 0 switches that method off). Each image draws its own lambda
  from Beta(alpha, alpha); for CutMix the box drawn from it is clipped to the image and lambda
  becomes the exact share of the image's own pixels left. Every array of `targets` (float
  one-hot or soft labels [B, K_i]) is mixed with the same per-image lambda. With the batch
  sharded over devices, fetching the partners moves images between them.

  Returns (images, targets).
  """
  targets = tuple(targets)
  for t in targets:
    if not jnp.issubdtype(t.dtype, jnp.floating):
      raise ValueError(f'mix: expected float one-hot or soft targets, got dtype {t.dtype}')
  methods = [(method, alpha) for method, alpha in ((_mixup, mixup_alpha), (_cutmix, cutmix_alpha))
             if alpha > 0]
  if not methods or prob <= 0:
    return images, targets
  apply_key, method_key, lam_key, mix_key = jax.random.split(key, 4)
  choice = jax.random.randint(method_key, (), 0, len(methods))
  # One Beta draw serves either method: its sampler (a rejection loop) is the slowest part of
  # the step to compile, about 2 s on CPU.
  alpha = jnp.array([alpha for _, alpha in methods])[choice]
  lam = jax.random.beta(lam_key, alpha, alpha, (images.shape[0],))
  index = jnp.where(jax.random.uniform(apply_key) < prob, 1 + choice, 0)
  # A switch, not a select of both results: only the chosen branch runs, and the branch
  # boundary stops XLA on CPU from fusing the bilinear gathers of `random_affine` into the
  # batch permutation below, which made the pair 10x slower (50 ms vs 4.5 ms, B=64, 128x128).
  branches = [lambda key, images, targets, lam: (images, targets)]
  branches += [method for method, _ in methods]
  return jax.lax.switch(index, branches, mix_key, images, targets, lam)


def _mixup(key, images, targets, lam):
  return _blend(key, images, targets, lam[:, None, None], lam)


def _cutmix(key, images, targets, lam):
  batch, height, width = images.shape[:3]
  box_key, perm_key = jax.random.split(key)
  # The box has the image's aspect ratio and area (1 - lam) before clipping.
  size = jnp.array([height, width])
  cut = jnp.sqrt(1 - lam)[:, None] * size
  centre = jax.random.uniform(box_key, (batch, 2)) * size
  low = jnp.clip(jnp.round(centre - cut / 2), 0, size)
  high = jnp.clip(jnp.round(centre + cut / 2), 0, size)
  y, x = _pixel_axes(height, width)
  inside = ((y >= low[:, 0, None, None]) & (y < high[:, 0, None, None])
            & (x >= low[:, 1, None, None]) & (x < high[:, 1, None, None]))
  lam = 1 - jnp.prod(high - low, axis=1) / (height * width)
  return _blend(perm_key, images, targets, jnp.where(inside, 0.0, 1.0), lam)


def _blend(key, images, targets, keep, lam):
  """keep: [B, H, W] (or broadcastable) weight of each image's own pixels; lam: [B] weight of
  its own targets; the rest comes from its partner."""
  perm = jax.random.permutation(key, images.shape[0])
  keep = keep[..., None].astype(images.dtype)
  images = keep * images + (1 - keep) * images[perm]
  targets = tuple(lam[:, None].astype(t.dtype) * t + (1 - lam[:, None]).astype(t.dtype) * t[perm]
                  for t in targets)
  return images, targets
