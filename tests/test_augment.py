import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bengrapheme import augment


def random_images(seed=0, shape=(6, 24, 40, 1)):
  return jax.random.uniform(jax.random.key(seed), shape, jnp.float32)


def one_hot_targets(batch):
  """The three grapheme components plus a whole-grapheme target, one label per image."""
  labels = np.arange(batch)
  return tuple(jax.nn.one_hot(labels % k, k) for k in (168, 11, 7, 1295))


def off_config():
  aug = augment.default_config()
  aug.affine = False
  aug.cutout_prob = aug.grid_mask_prob = aug.mix_prob = 0.0
  return aug


def test_default_config_fields():
  aug = augment.default_config()
  assert set(aug.keys()) == {'affine', 'rotate_deg', 'shear_deg', 'scale', 'translate',
                             'cutout_prob', 'cutout_size', 'grid_mask_prob', 'mixup_alpha',
                             'cutmix_alpha', 'mix_prob'}
  assert aug.scale == (0.85, 1.15)


@pytest.mark.parametrize('channels', [1, 3])
def test_shapes_and_dtypes_preserved(channels):
  images = random_images(shape=(4, 20, 28, channels))
  key = jax.random.key(1)
  outputs = [
      augment.random_affine(key, images, rotate_deg=10, shear_deg=10, scale=(0.8, 1.2),
                            translate=0.1),
      augment.cutout(key, images, size_fraction=0.3, prob=1.0),
      augment.grid_mask(key, images, prob=1.0),
  ]
  targets = one_hot_targets(4)
  mixed, mixed_targets = augment.mix(key, images, targets, mixup_alpha=0.4, cutmix_alpha=1.0,
                                     prob=1.0)
  applied, applied_targets = augment.apply(key, images, targets, augment.default_config())
  for out in outputs + [mixed, applied]:
    assert out.shape == images.shape and out.dtype == jnp.float32
  for out_targets in (mixed_targets, applied_targets):
    assert isinstance(out_targets, tuple)
    assert [t.shape for t in out_targets] == [t.shape for t in targets]
    assert all(t.dtype == jnp.float32 for t in out_targets)


def test_identity_affine_returns_input():
  images = random_images()
  out = augment.random_affine(jax.random.key(2), images, rotate_deg=0, shear_deg=0,
                              scale=(1, 1), translate=0)
  np.testing.assert_array_equal(out, images)


def dot_image(size, y, x):
  image = np.zeros((1, size, size, 1), np.float32)
  image[0, y, x, 0] = 1.0
  return jnp.asarray(image)


def ink_position(image):
  return np.unravel_index(np.argmax(np.asarray(image)[0, :, :, 0]), image.shape[1:3])


def transform(image, angle=0.0, shear=0.0, scale=1.0, dy=0.0, dx=0.0):
  return augment.affine_transform(image, jnp.array([angle]), jnp.array([shear]),
                                  jnp.array([scale]), jnp.array([[dy, dx]]))


def test_known_transforms_move_ink_where_expected():
  # A dot 10 pixels right of the centre of a 33x33 image (centre (16, 16)).
  image = dot_image(33, 16, 26)
  cases = [
      (dict(angle=90.0), (6, 16)),  # counter-clockwise: right of centre -> above it
      (dict(angle=-90.0), (26, 16)),
      (dict(angle=180.0), (16, 6)),
      (dict(scale=1.5), (16, 31)),
      (dict(dy=3.0, dx=-4.0), (19, 22)),
  ]
  for params, want in cases:
    out = transform(image, **params)
    assert ink_position(out) == want, params
    assert float(out.max()) > 0.99, params
  # Shear slants to the right going down: a dot below the centre moves right.
  out = transform(dot_image(33, 26, 16), shear=45.0)
  assert ink_position(out) == (26, 26)
  # A half-pixel shift spreads the ink bilinearly over two pixels.
  out = np.asarray(transform(image, dx=0.5))[0, :, :, 0]
  np.testing.assert_allclose(out[16, 26:28], [0.5, 0.5], atol=1e-6)
  assert out.sum() == pytest.approx(1.0)


def test_outside_is_blank_paper():
  images = jnp.ones((1, 16, 16, 1))
  out = np.asarray(transform(images, scale=0.5))[0, :, :, 0]
  # Shrunk to half size: a border of paper around an unchanged middle.
  assert out[0].max() == 0 and out[:, 0].max() == 0 and out[:, -1].max() == 0
  np.testing.assert_allclose(out[5:11, 5:11], 1.0)


def test_random_affine_draws_parameters_per_image():
  images = jnp.broadcast_to(dot_image(33, 16, 26), (8, 33, 33, 1))
  out = augment.random_affine(jax.random.key(3), images, rotate_deg=30, shear_deg=0,
                              scale=(1, 1), translate=0)
  positions = {ink_position(out[i:i + 1]) for i in range(8)}
  assert len(positions) > 4


def test_cutout_blanks_one_rectangle():
  images = jnp.ones((16, 20, 30, 1))
  out = np.asarray(augment.cutout(jax.random.key(4), images, size_fraction=0.3, prob=1.0))
  for image in out[..., 0]:
    rows, cols = np.nonzero(image == 0)
    assert 0 < len(rows) <= 6 * 9
    # The blank pixels fill their bounding box: a rectangle (clipped at the border).
    assert len(rows) == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)
  assert set(np.unique(out)) == {0.0, 1.0}
  np.testing.assert_array_equal(
      augment.cutout(jax.random.key(4), images, size_fraction=0.3, prob=0.0), images)


def test_grid_mask_erases_a_grid():
  images = jnp.ones((64, 48, 48, 1))
  out = np.asarray(augment.grid_mask(jax.random.key(5), images, prob=1.0, ratio=0.5))
  erased = 1 - out.mean(axis=(1, 2, 3))
  assert 0.1 < erased.min() and erased.max() < 0.45
  assert erased.mean() == pytest.approx(0.25, abs=0.05)
  assert set(np.unique(out)) == {0.0, 1.0}
  # Holes are squares on a grid: every erased row has the same erased columns.
  image = out[0, :, :, 0]
  erased_rows = image.min(axis=1) == 0
  assert (image[erased_rows] == image[erased_rows][0]).all()
  half = np.asarray(augment.grid_mask(jax.random.key(5), images, prob=0.5))
  untouched = (half == 1).all(axis=(1, 2, 3))
  assert 10 < untouched.sum() < 54


def constant_images(batch, size=(24, 32)):
  """Image i is filled with the value i + 1, so mixed pixels tell where they came from."""
  return jnp.broadcast_to(jnp.arange(1, batch + 1, dtype=jnp.float32)[:, None, None, None],
                          (batch, *size, 1))


@pytest.mark.parametrize('mixup_alpha,cutmix_alpha', [(0.4, 0.0), (0.0, 1.0), (0.4, 1.0)])
def test_mixed_targets_match_mixed_images(mixup_alpha, cutmix_alpha):
  batch = 16
  images, targets = constant_images(batch), one_hot_targets(batch)
  out, mixed = augment.mix(jax.random.key(6), images, targets, mixup_alpha=mixup_alpha,
                           cutmix_alpha=cutmix_alpha, prob=1.0)
  for t in mixed:
    np.testing.assert_allclose(t.sum(axis=1), 1.0, atol=1e-6)
    assert float(t.min()) >= 0
  # The whole-grapheme target gives image i class i, so it reads back every image's lambda;
  # the image mean is then the lambda-weighted mean of the two source values.
  whole = np.asarray(mixed[3])
  means = np.asarray(out).mean(axis=(1, 2, 3))
  np.testing.assert_allclose(means, whole[:, :batch] @ np.arange(1, batch + 1), rtol=1e-5)
  assert (np.diag(whole) < 1).any()
  # Components with fewer classes than the batch mixed with the same lambdas.
  for t in mixed[:3]:
    k = t.shape[1]
    folded = np.zeros((batch, k))
    for c in range(batch):
      folded[:, c % k] += whole[:, c]
    np.testing.assert_allclose(t, folded, atol=1e-6)


def test_cutmix_lambda_is_pasted_area():
  batch = 32
  images, targets = constant_images(batch), one_hot_targets(batch)
  out, mixed = augment.mix(jax.random.key(7), images, targets, mixup_alpha=0.0, cutmix_alpha=1.0,
                           prob=1.0)
  own = np.asarray(out)[..., 0] == np.arange(1, batch + 1)[:, None, None]
  lam = np.diag(np.asarray(mixed[3])[:, :batch])
  np.testing.assert_allclose(own.mean(axis=(1, 2)), lam, atol=1e-6)
  assert (lam < 1).sum() > batch // 2
  for image_own in own:
    rows, cols = np.nonzero(~image_own)
    if len(rows):
      assert len(rows) == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)  # one pasted rectangle


def test_mix_off_is_identity():
  images, targets = random_images(), one_hot_targets(6)
  for kwargs in (dict(mixup_alpha=0.4, cutmix_alpha=1.0, prob=0.0),
                 dict(mixup_alpha=0.0, cutmix_alpha=0.0, prob=1.0)):
    out, mixed = augment.mix(jax.random.key(8), images, targets, **kwargs)
    np.testing.assert_array_equal(out, images)
    for a, b in zip(mixed, targets):
      np.testing.assert_array_equal(a, b)


def test_mix_rejects_integer_targets():
  with pytest.raises(ValueError, match='float'):
    augment.mix(jax.random.key(0), random_images(), (jnp.zeros((6, 3), jnp.int32),),
                mixup_alpha=0.4, cutmix_alpha=0.0, prob=1.0)


def test_apply_with_everything_off_is_identity():
  images, targets = random_images(), one_hot_targets(6)
  aug = off_config()
  step = jax.jit(lambda key, images, targets: augment.apply(key, images, targets, aug))
  out, out_targets = step(jax.random.key(9), images, targets)
  np.testing.assert_array_equal(out, images)
  for a, b in zip(out_targets, targets):
    np.testing.assert_array_equal(a, b)


def test_apply_is_deterministic_under_jit():
  images, targets = random_images(shape=(8, 32, 32, 1)), one_hot_targets(8)
  aug = augment.default_config()
  aug.cutout_prob = 0.5
  aug.mixup_alpha = 0.4
  step = jax.jit(lambda key, images, targets: augment.apply(key, images, targets, aug))
  first = step(jax.random.key(10), images, targets)
  again = step(jax.random.key(10), images, targets)
  other = step(jax.random.key(11), images, targets)
  jax.tree.map(np.testing.assert_array_equal, first, again)
  assert not np.array_equal(first[0], other[0])
  eager = augment.apply(jax.random.key(10), images, targets, aug)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), first, eager)


# A fresh interpreter, because the simulated device count must be set before jax is imported.
SHARDED_SCRIPT = textwrap.dedent("""
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from bengrapheme import augment
  assert jax.device_count() == 8, jax.devices()
  mesh = Mesh(np.array(jax.devices()), ('data',))
  batch = NamedSharding(mesh, P('data'))
  images = jax.random.uniform(jax.random.key(0), (16, 24, 24, 1))
  targets = tuple(jax.nn.one_hot(jnp.arange(16) % k, k) for k in (168, 11, 7))
  aug = augment.default_config()
  aug.mix_prob = 1.0
  step = jax.jit(lambda key, images, targets: augment.apply(key, images, targets, aug),
                 out_shardings=batch)
  sharded = step(jax.random.key(1), jax.device_put(images, batch),
                 jax.device_put(targets, batch))
  assert sharded[0].sharding.spec == P('data'), sharded[0].sharding
  single = jax.jit(lambda key, images, targets: augment.apply(key, images, targets, aug))(
      jax.random.key(1), images, targets)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), sharded, single)
  print('ok')
""")


def test_apply_sharded_over_8_devices():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8',
             PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get('PYTHONPATH')])))
  result = subprocess.run([sys.executable, '-c', SHARDED_SCRIPT], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('ok')
