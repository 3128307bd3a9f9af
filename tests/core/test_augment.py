import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bengrapheme import augment, defaults

from conftest import ROOT


# Compiled once here and shared: jax.random.beta alone takes ~2 s of CPU to compile, and eager
# calls would compile every primitive on its own.
affine = jax.jit(augment.affine_transform)
random_affine = jax.jit(augment.random_affine,
                        static_argnames=('rotate_deg', 'shear_deg', 'scale', 'translate'))
cutout = jax.jit(augment.cutout, static_argnames=('size_fraction', 'prob'))
random_erasing = jax.jit(augment.random_erasing, static_argnames=('prob', 'area', 'aspect'))
grid_mask = jax.jit(augment.grid_mask, static_argnames=('prob', 'ratio', 'period'))
mix = jax.jit(augment.mix, static_argnames=('mixup_alpha', 'cutmix_alpha', 'prob'))
BATCH = 16


def jit_apply(aug):
  return jax.jit(lambda key, images, targets: augment.apply(key, images, targets, aug))


# Every stage on, mixing always: the config of the jit and sharding checks.
APPLY_AUG = defaults.augmentation()
APPLY_AUG.update(affine=True, rotate_deg=10.0, shear_deg=10.0, scale=(0.85, 1.15),
                 translate=0.08, cutout_prob=0.5, erase_prob=0.5, grid_mask_prob=0.3,
                 cutmix_alpha=1.0, mix_prob=1.0)
apply_step = jit_apply(APPLY_AUG)


def random_images(seed=0, shape=(BATCH, 24, 32, 1)):
  return jnp.asarray(np.random.default_rng(seed).random(shape, np.float32))


def one_hot_targets(batch=BATCH):
  """The three grapheme components plus a whole-grapheme target, one label per image."""
  labels = np.arange(batch)
  return tuple(jax.nn.one_hot(labels % k, k) for k in (168, 11, 7, 1295))


def test_default_config_fields():
  aug = defaults.augmentation()
  assert set(aug.keys()) == {'affine', 'rotate_deg', 'shear_deg', 'scale', 'translate',
                             'cutout_prob', 'cutout_size', 'erase_prob', 'erase_area',
                             'grid_mask_prob', 'mixup_alpha', 'cutmix_alpha', 'mix_prob'}


@pytest.mark.slow
def test_shapes_and_dtypes_preserved():
  images, targets = random_images(), one_hot_targets()
  key = jax.random.key(1)
  out = random_affine(key, images, rotate_deg=10, shear_deg=10, scale=(0.8, 1.2), translate=0.1)
  assert out.shape == images.shape and out.dtype == jnp.float32
  mixed, mixed_targets = mix(key, images, targets, mixup_alpha=0.4, cutmix_alpha=1.0, prob=1.0)
  assert mixed.shape == images.shape and mixed.dtype == jnp.float32
  assert isinstance(mixed_targets, tuple)
  assert [t.shape for t in mixed_targets] == [t.shape for t in targets]
  assert all(t.dtype == jnp.float32 for t in mixed_targets)
  # Colour images: every channel is warped with the same coordinates.
  rgb = jnp.repeat(random_images(shape=(2, 24, 32, 1)), 3, axis=-1)
  out = np.asarray(random_affine(key, rgb, rotate_deg=10, shear_deg=10, scale=(0.8, 1.2),
                                 translate=0.1))
  assert out.shape == rgb.shape
  np.testing.assert_array_equal(out[..., 1:], out[..., :2])
  assert not np.array_equal(out, rgb)


def test_identity_affine_returns_input():
  images = random_images()
  out = random_affine(jax.random.key(2), images, rotate_deg=0, shear_deg=0, scale=(1, 1),
                      translate=0)
  np.testing.assert_array_equal(out, images)


def dot_image(y, x, size=33):
  image = np.zeros((1, size, size, 1), np.float32)
  image[0, y, x, 0] = 1.0
  return jnp.asarray(image)


def ink_position(image):
  return np.unravel_index(np.argmax(np.asarray(image)[:, :, 0]), image.shape[:2])


def transform(image, angle=0.0, shear=0.0, scale=1.0, dy=0.0, dx=0.0):
  return affine(image, jnp.array([angle]), jnp.array([shear]), jnp.array([scale]),
                jnp.array([[dy, dx]]))[0]


def test_known_transforms_move_ink_where_expected():
  # A dot 10 pixels right of the centre (16, 16) of a 33x33 image.
  image = dot_image(16, 26)
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
  out = transform(dot_image(26, 16), shear=45.0)
  assert ink_position(out) == (26, 26)
  # A half-pixel shift spreads the ink bilinearly over two pixels.
  out = np.asarray(transform(image, dx=0.5))[:, :, 0]
  np.testing.assert_allclose(out[16, 26:28], [0.5, 0.5], atol=1e-6)
  assert out.sum() == pytest.approx(1.0)
  # Shrunk to half size, an all-ink image keeps its middle and gains a border of paper.
  out = np.asarray(transform(jnp.ones((1, 33, 33, 1)), scale=0.5))[:, :, 0]
  assert out[0].max() == 0 and out[:, 0].max() == 0 and out[:, -1].max() == 0
  np.testing.assert_allclose(out[9:24, 9:24], 1.0)


def test_random_affine_draws_parameters_per_image():
  images = jnp.broadcast_to(dot_image(16, 26), (8, 33, 33, 1))
  out = random_affine(jax.random.key(3), images, rotate_deg=30, shear_deg=0, scale=(1, 1),
                      translate=0)
  assert len({ink_position(image) for image in out}) > 4


def test_cutout_blanks_one_rectangle():
  images = jnp.ones((BATCH, 24, 32, 1))
  out = np.asarray(cutout(jax.random.key(4), images, size_fraction=0.3, prob=1.0))
  for image in out[..., 0]:
    rows, cols = np.nonzero(image == 0)
    assert 0 < len(rows) <= 7 * 10
    # The blank pixels fill their bounding box: a rectangle (clipped at the border).
    assert len(rows) == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)
  assert out.dtype == np.float32 and set(np.unique(out)) == {0.0, 1.0}


def test_random_erasing_fills_one_rectangle_inside_the_image_with_noise():
  images = jnp.full((64, 24, 32, 1), 2.0)  # 2: a value the uniform noise in [0, 1) never takes
  out = np.asarray(random_erasing(jax.random.key(6), images, prob=1.0, area=(0.02, 0.33)))
  areas = []
  for image in out[..., 0]:
    rows, cols = np.nonzero(image != 2)
    assert len(rows) == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)  # a full rectangle
    assert ((image[rows, cols] >= 0) & (image[rows, cols] < 1)).all()
    areas.append(len(rows) / image.size)
  # Area drawn uniformly in [0.02, 0.33] (aspect clipping at the border only shrinks it).
  assert 0.01 < min(areas) and max(areas) < 0.36 and 0.1 < np.mean(areas) < 0.22
  half = np.asarray(random_erasing(jax.random.key(6), images, prob=0.5))
  assert 10 < (half == 2).all(axis=(1, 2, 3)).sum() < 54


def test_grid_mask_erases_a_grid():
  images = jnp.ones((64, 48, 48, 1))
  out = np.asarray(grid_mask(jax.random.key(5), images, prob=1.0, ratio=0.5))
  erased = 1 - out.mean(axis=(1, 2, 3))
  assert 0.1 < erased.min() and erased.max() < 0.45
  assert erased.mean() == pytest.approx(0.25, abs=0.05)
  assert out.dtype == np.float32 and set(np.unique(out)) == {0.0, 1.0}
  # Holes are squares on a grid: every erased row has the same erased columns.
  image = out[0, :, :, 0]
  erased_rows = image.min(axis=1) == 0
  assert (image[erased_rows] == image[erased_rows][0]).all()
  half = np.asarray(grid_mask(jax.random.key(5), images, prob=0.5))
  untouched = (half == 1).all(axis=(1, 2, 3))
  assert 10 < untouched.sum() < 54


def constant_images(batch=BATCH, size=(24, 32)):
  """Image i is filled with the value i + 1, so mixed pixels tell where they came from."""
  return jnp.broadcast_to(jnp.arange(1, batch + 1, dtype=jnp.float32)[:, None, None, None],
                          (batch, *size, 1))


@functools.lru_cache
def mixed_batches():
  """(seed, images, mixed images, mixed targets) for a few keys, MixUp and CutMix both on."""
  images, targets = constant_images(), one_hot_targets()
  return [(seed, images, *mix(jax.random.key(seed), images, targets, mixup_alpha=0.4,
                              cutmix_alpha=1.0, prob=1.0)) for seed in range(8)]


def is_cutmix(out):
  """CutMix copies pixels of the constant images, MixUp blends them."""
  return np.isin(np.asarray(out), np.arange(1, BATCH + 1)).all()


def test_mixed_targets_match_mixed_images():
  for seed, images, out, mixed in mixed_batches():
    for t in mixed:
      np.testing.assert_allclose(t.sum(axis=1), 1.0, atol=1e-6)
      assert float(t.min()) >= 0
    # The whole-grapheme target gives image i class i, so it reads back every image's
    # lambda; the image mean is then the lambda-weighted mean of the two source values.
    whole = np.asarray(mixed[3])
    means = np.asarray(out).mean(axis=(1, 2, 3))
    np.testing.assert_allclose(means, whole[:, :BATCH] @ np.arange(1, BATCH + 1), rtol=1e-5)
    assert (np.diag(whole) < 1).any(), seed
    # The components, with fewer classes than the batch, mixed with the same lambdas.
    for t in mixed[:3]:
      folded = np.zeros(t.shape)
      for c in range(BATCH):
        folded[:, c % t.shape[1]] += whole[:, c]
      np.testing.assert_allclose(t, folded, atol=1e-6)
  assert {is_cutmix(out) for _, _, out, _ in mixed_batches()} == {True, False}


def test_cutmix_lambda_is_pasted_area():
  cutmixed = [(out, mixed) for _, _, out, mixed in mixed_batches() if is_cutmix(out)]
  assert cutmixed
  for out, mixed in cutmixed:
    own = np.asarray(out)[..., 0] == np.arange(1, BATCH + 1)[:, None, None]
    lam = np.diag(np.asarray(mixed[3])[:, :BATCH])
    np.testing.assert_allclose(own.mean(axis=(1, 2)), lam, atol=1e-6)
    assert (lam < 1).sum() > BATCH // 2
    for image_own in own:
      rows, cols = np.nonzero(~image_own)
      if len(rows):
        assert len(rows) == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)  # one pasted rectangle


def test_mix_off_is_identity():
  images, targets = random_images(), one_hot_targets()
  for kwargs in (dict(mixup_alpha=0.4, cutmix_alpha=1.0, prob=0.0),
                 dict(mixup_alpha=0.0, cutmix_alpha=0.0, prob=1.0)):
    out, mixed = augment.mix(jax.random.key(8), images, targets, **kwargs)
    np.testing.assert_array_equal(out, images)
    for a, b in zip(mixed, targets):
      np.testing.assert_array_equal(a, b)


def test_mix_rejects_integer_targets():
  with pytest.raises(ValueError, match='float'):
    augment.mix(jax.random.key(0), random_images(), (jnp.zeros((BATCH, 3), jnp.int32),),
                mixup_alpha=0.4, cutmix_alpha=0.0, prob=1.0)


def test_the_defaults_augment_nothing():
  """A task whose config leaves the aug section as it is gets its images unchanged: the core
  turns no augmentation on for a task that did not ask."""
  aug = defaults.augmentation()
  images, targets = random_images(), one_hot_targets()
  out, out_targets = jit_apply(aug)(jax.random.key(9), images, targets)
  np.testing.assert_array_equal(out, images)
  for a, b in zip(out_targets, targets):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_apply_is_deterministic_under_jit():
  images, targets = random_images(), one_hot_targets()
  first = apply_step(jax.random.key(10), images, targets)
  again = apply_step(jax.random.key(10), images, targets)
  other = apply_step(jax.random.key(11), images, targets)
  jax.tree.map(np.testing.assert_array_equal, first, again)
  assert not np.array_equal(first[0], other[0])
  assert first[0].shape == images.shape and first[0].dtype == jnp.float32
  assert [t.shape for t in first[1]] == [t.shape for t in targets]


# A fresh interpreter, because the simulated device count must be set before jax is imported
# and another test module may have imported it already.
SHARDED_SCRIPT = textwrap.dedent("""
  import json, sys
  import jax, jax.numpy as jnp, ml_collections, numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from bengrapheme import augment
  aug = ml_collections.ConfigDict(json.loads(sys.argv[1]))
  assert jax.device_count() == 8, jax.devices()
  batch = NamedSharding(Mesh(np.array(jax.devices()), ('data',)), P('data'))
  images = jax.device_put(np.load(sys.argv[2]), batch)
  targets = tuple(jax.device_put(jax.nn.one_hot(np.arange(16) % k, k), batch)
                  for k in (168, 11, 7, 1295))
  step = jax.jit(lambda key, images, targets: augment.apply(key, images, targets, aug),
                 out_shardings=batch)
  out, out_targets = step(jax.random.key(12), images, targets)
  assert out.sharding.spec == P('data'), out.sharding
  np.savez(sys.argv[3], out, *out_targets)
""")


@pytest.mark.slow
def test_apply_sharded_over_8_devices_matches_one_device(tmp_path):
  images, targets = random_images(), one_hot_targets()
  np.save(tmp_path / 'images.npy', images)
  flags = os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=flags,
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
  result = subprocess.run(
      [sys.executable, '-c', SHARDED_SCRIPT, APPLY_AUG.to_json(), str(tmp_path / 'images.npy'),
       str(tmp_path / 'out.npz')], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  sharded = np.load(tmp_path / 'out.npz')
  out, out_targets = apply_step(jax.random.key(12), images, targets)
  for i, want in enumerate([out, *out_targets]):
    np.testing.assert_allclose(sharded[f'arr_{i}'], want, atol=1e-5)
