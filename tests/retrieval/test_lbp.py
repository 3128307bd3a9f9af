"""SRS-LBP baseline: hand-computed codes, feature layout, a real texture check, the batched
kernels against the numpy reference they replaced, and the shape buckets they batch by."""
import os

import numpy as np
import pytest

from retrieval.features import buckets, lbp, lbp_host, pca as pca_lib
from retrieval.fragments import metrics, reader

RAMP = np.array([[10, 20, 30],
                 [40, 50, 60],
                 [70, 80, 90]], np.uint8)


def test_codes_on_a_ramp():
  # Grey = 50 + 10 dx + 30 dy around the centre; bilinear sampling is exact on a plane, so
  # neighbour p at angle 45p deg reads 50 + 10 cos + 30 sin (y down), rounded:
  # p0 60, p1 78.3->78, p2 80, p3 64.1->64, p4 40, p5 21.7->22, p6 20, p7 35.9->36.
  assert lbp.lbp_codes(RAMP, 1).tolist() == [[0b00001111]]
  # Threshold 15: bright enough only when > 65, i.e. p1 and p2.
  assert lbp.lbp_codes(RAMP, 1, threshold=15).tolist() == [[0b00000110]]


def test_codes_bilinear_diagonal():
  # Only the south-east pixel is bright. Neighbour p1 sits at (+0.707, +0.707):
  # 100 * 0.293^2 + 200 * 0.707^2 = 108.6 -> 109 > 100; p3, p5, p7 only see 100 * 0.086.
  img = np.zeros((3, 3), np.uint8)
  img[1, 1], img[2, 2] = 100, 200
  assert lbp.lbp_codes(img, 1).tolist() == [[0b00000010]]


def test_codes_radius_two():
  # Bright right column at distance 2 from the centre: p0 reads it, p1 and p7 interpolate
  # 100 * 0.586 + 150 * 0.414 = 120.7 between columns 3 and 4; the rest read 100.
  img = np.full((5, 5), 100, np.uint8)
  img[:, 4] = 150
  assert lbp.lbp_codes(img, 2).tolist() == [[0b10000011]]
  assert lbp.lbp_codes(np.zeros((9, 7), np.uint8), 3).shape == (3, 1)


def texture(kind, seed, size=96):
  """Grey fragment image on a black surround: two stroke styles, light noisy paper."""
  rng = np.random.default_rng(seed)
  img = np.full((size, size), 190.0) + rng.normal(0, 6, (size, size))
  yy, xx = np.mgrid[:size, :size]
  if kind == 'lines':  # thin horizontal strokes, like text lines
    for _ in range(40):
      y, x = rng.integers(4, size - 4), rng.integers(0, size - 20)
      img[y:y + 2, x:x + rng.integers(8, 20)] = 40
  else:  # thick diagonal strokes
    for _ in range(12):
      c = rng.integers(-size, size)
      img[np.abs(yy - xx - c) < 3] = 60
  img = np.clip(img, 0, 255).astype(np.uint8)
  img[(yy - size / 2) ** 2 + (xx - size / 2) ** 2 > (size / 2 - 2) ** 2] = 0
  return img


def test_features_layout_and_determinism():
  img = texture('lines', 0)
  f = lbp.lbp_features(img)
  assert f.shape == (12 * 256,) and f.dtype == np.float32
  blocks = f.reshape(12, 256)
  assert (blocks[:, 0] == 0).all()
  np.testing.assert_allclose(blocks.sum(axis=1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(f, lbp.lbp_features(img))


def test_outside_of_the_mask_is_never_read():
  img = texture('diagonal', 1)
  mask = lbp.fragment_mask(img)
  other = img.copy()
  other[~mask] = np.random.default_rng(0).integers(0, 256, (~mask).sum())
  np.testing.assert_array_equal(lbp.lbp_features(img), lbp.lbp_features(other, mask))
  # Ink strokes inside the fragment are part of it even when black.
  img[40:44, 40:60] = 0
  assert lbp.fragment_mask(img)[42, 50]


def test_radius_without_valid_area_gives_zeros():
  f = lbp.lbp_features(texture('diagonal', 2, size=20), radii=(1, 12)).reshape(2, 256)
  assert f[0].sum() == pytest.approx(1.0) and not f[1].any()


def bilde_otsu(hist):
  """Line-by-line transcription of bilde's LbpIterator::calculateOtsuThreshold."""
  total = int(hist.sum())
  mass = sum(k * int(h) for k, h in enumerate(hist))
  sum_b, w_b, var_max, threshold = 0.0, 0, 0.0, 0
  for t, h in enumerate(hist):
    w_b += int(h)
    if w_b == 0:
      continue
    w_f = total - w_b
    if w_f == 0:
      break
    sum_b += t * int(h)
    between = w_b * w_f * (sum_b / w_b - (mass - sum_b) / w_f) ** 2
    if between >= var_max:
      var_max, threshold = between, t
  return 0 if hist[:threshold].sum() >= total * 0.99 else threshold


@pytest.mark.parametrize('seed', range(4))
def test_otsu_matches_bilde(seed):
  rng = np.random.default_rng(seed)
  shape = (7, 9)
  centre = rng.integers(0, 256, shape).astype(np.int16)
  spread = rng.choice([3, 30, 120])
  samples = [np.clip(centre + rng.integers(-spread, spread + 1, shape), 0, 255).astype(np.int16)
             for _ in range(8)]
  valid = rng.random(shape) < 0.8
  hist = sum(np.bincount(np.abs(s - centre)[valid], minlength=256) for s in samples)
  assert lbp_host.otsu(hist) == bilde_otsu(hist)
  # The reference looks at every second row and column: repeat each pixel 2 x 2 so that it
  # sees exactly the arrays above.
  up = lambda a: np.repeat(np.repeat(a, 2, axis=0), 2, axis=1)
  got = lbp_host._otsu_threshold([up(s) for s in samples], up(centre), up(valid))
  assert got == bilde_otsu(hist)


def test_pca_embed():
  rng = np.random.default_rng(3)
  feats = rng.random((30, 3072)).astype(np.float32)
  pca = pca_lib.fit(feats, dim=10)
  out = lbp.embed(pca, feats[:5])
  assert out.shape == (5, 10) and out.dtype == np.float32
  y = (feats[:5] - pca.mean) @ pca.components.T
  want = np.sign(y) * np.sqrt(np.abs(y))
  np.testing.assert_allclose(out, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-5)
  np.testing.assert_array_equal(pca.components, pca_lib.fit(feats, dim=10).components)
  with pytest.raises(ValueError, match='dim'):
    pca_lib.fit(feats, dim=31)


def test_texture_styles_separate():
  # A real behaviour check of the whole baseline: fragments of the same stroke style are
  # nearer (L1 after PCA + Hellinger + L2) than fragments of the other style.
  kinds = ['lines', 'diagonal']
  train = np.stack([lbp.lbp_features(texture(k, s)) for k in kinds for s in range(100, 106)])
  test = np.stack([lbp.lbp_features(texture(k, s)) for k in kinds for s in range(5)])
  labels = np.repeat([0, 1], 5)
  emb = lbp.embed(pca_lib.fit(train, dim=8), test)
  d = np.abs(emb[:, None] - emb[None]).sum(-1)
  same = labels[:, None] == labels[None]
  off = ~np.eye(len(labels), dtype=bool)
  assert d[same & off].mean() < 0.5 * d[~same].mean()
  result = metrics.retrieval_metrics(emb, labels, metric='cityblock')
  assert result['top1'] == 1.0 and result['pr10'] == 1.0 and result['map'] > 0.95


def fragments(folder, n):
  """Grey uint8 images of the first n fragment files of `folder`."""
  names = sorted(os.listdir(folder))[:n]
  return [np.asarray(reader.convert(reader.decode(os.path.join(folder, f)), color=False))
          for f in names]


@pytest.mark.slow
def test_features_equal_the_reference_in_one_batch(fragment_data):
  rng = np.random.default_rng(5)
  greys = fragments(os.path.join(fragment_data, 'test'), 3)
  # Noise that shares buckets with the fragments: several images a bucket, and a batch with
  # an empty row.
  greys += [rng.integers(0, 256, shape).astype(np.uint8)
            for shape in [(110, 80), (128, 71), (600, 500)]]
  shapes = [g.shape for g in greys]
  sizes = sorted(len(rows) for _, rows, _ in buckets.groups(shapes))
  assert len(sizes) >= 2 and sizes[-1] >= 3, sizes
  got = lbp.features(greys)
  assert got.shape == (len(greys), 3072) and got.dtype == np.float32
  for g, f in zip(greys, got):
    np.testing.assert_array_equal(f, lbp_host.lbp_features(g))
  # Caller's masks (noise with a hole: codes next to it are left out), a fixed threshold.
  masks = [np.ones(s, bool) for s in shapes]
  for m in masks:
    m[m.shape[0] // 3:m.shape[0] // 2, 10:30] = False
  got = lbp.features(greys, masks, threshold=5)
  for g, m, f in zip(greys, masks, got):
    np.testing.assert_array_equal(f, lbp_host.lbp_features(g, m, threshold=5))


@pytest.mark.slow
def test_features_padded_equal_the_image_alone():
  img = texture('lines', 3, size=101)[:, :91]  # odd sides: an odd number of centres
  mask = lbp.fragment_mask(img)
  alone = lbp.features_padded(img[None], mask[None])
  np.testing.assert_array_equal(alone[0], lbp_host.lbp_features(img, mask))
  # Into a larger bucket, with noise in the padding (outside the mask) and empty rows.
  grey = np.random.default_rng(0).integers(0, 256, (4, 128, 96)).astype(np.uint8)
  grey[0, :101, :91] = img
  padded_mask = buckets.pad([mask], (128, 96), 4, fill=False)
  got = lbp.features_padded(grey, padded_mask)
  np.testing.assert_array_equal(got[0], alone[0])
  assert not got[1:].any()


def test_single_image_calls_match_the_reference():
  img = texture('diagonal', 4, size=64)
  for r in (1, 2, 5):
    np.testing.assert_array_equal(lbp.lbp_codes(img, r, threshold=3),
                                  lbp_host.lbp_codes(img, r, threshold=3))
  np.testing.assert_array_equal(lbp.lbp_features(img, radii=(3, 7)),
                                lbp_host.lbp_features(img, radii=(3, 7)))
  with pytest.raises(ValueError, match='mask shape'):
    lbp.lbp_features(img, np.ones((3, 3), bool))


def test_bucket_shapes_follow_the_ladder():
  assert buckets.bucket_shape(1, 64) == (64, 64)
  assert buckets.bucket_shape(65, 300) == (96, 384)
  assert buckets.bucket_shape(670, 1500) == (768, 1536)
  assert buckets.bucket_shape(4096, 4097) == (4096, 6144)
  assert buckets.bucket_shape(9000, 2049) == (10240, 3072)
  with pytest.raises(ValueError, match='not positive'):
    buckets.bucket_shape(0, 10)


def test_groups_keep_order_and_bound_batches():
  shapes = [(300, 300), (60, 60), (290, 280), (700, 500), (50, 64), (260, 300)] + [(60, 60)] * 5
  out = buckets.groups(shapes, max_pixels=3 * 384 * 384)
  assert [(shape, rows, batch) for shape, rows, batch in out] == [
      ((384, 384), [0, 2], 2), ((384, 384), [5], 1),  # 3 fit, rounded down to 2 a group
      ((64, 64), [1, 4, 6, 7, 8, 9, 10], 8),
      ((768, 512), [3], 1)]  # larger than max_pixels: alone
  for shape, rows, batch in out:
    assert batch * shape[0] * shape[1] <= max(3 * 384 * 384, shape[0] * shape[1])
  assert sorted(r for _, rows, _ in out for r in rows) == list(range(len(shapes)))


def test_pad_aligns_top_left():
  a, b = np.full((2, 3), 7, np.uint8), np.full((4, 1), 9, np.uint8)
  out = buckets.pad([a, b], (4, 4), 4, fill=1)
  assert out.shape == (4, 4, 4) and out.dtype == np.uint8
  assert (out[0, :2, :3] == 7).all() and (out[1, :, :1] == 9).all()
  assert out[0].sum() == 6 * 7 + 10 and out[1].sum() == 4 * 9 + 12 and (out[2:] == 1).all()
  with pytest.raises(ValueError, match='does not fit'):
    buckets.pad([np.zeros((5, 1))], (4, 4), 1)
  with pytest.raises(ValueError, match='do not fit'):
    buckets.pad([a, a], (4, 4), 1)
