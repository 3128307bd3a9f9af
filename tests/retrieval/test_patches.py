"""The patch pipeline: ink-centred patches, their cache, surrogate classes, aggregation,
SGR re-ranking and fusion, each against a plain reference."""
import contextlib
import functools
import json
import os
import shutil

import numpy as np
import pytest

from conftest import run_module
from configs import fragments as fragment_configs
from retrieval.features import aggregate, buckets, patches, surrogate
from retrieval.fragments import data, reader

BOUNDS = (0.05, 0.6)


def first_fragments(folder, n=6):
  return sorted(os.path.join(folder, f) for f in os.listdir(folder))[:n]


def test_patches_hold_ink_within_bounds_and_repeat(fragment_data):
  for path in first_fragments(os.path.join(fragment_data, 'test')):
    rgb = reader.decode(path)
    got, sift, _, _ = patches.extract(rgb, os.path.basename(path), size=32, max_patches=24,
                                      ink_bounds=BOUNDS, seed=0, descriptors=True)
    assert got.dtype == np.uint8 and got.shape[1:] == (32, 32) and 1 <= len(got) <= 24
    assert set(np.unique(got)) <= {0, 255} and sift.shape == (len(got), 128)
    share = (got > 0).mean(axis=(1, 2))
    assert (share >= BOUNDS[0]).all() and (share <= BOUNDS[1]).all()
    again = patches.extract(rgb, os.path.basename(path), size=32, max_patches=24,
                            ink_bounds=BOUNDS, seed=0).patches
    np.testing.assert_array_equal(got, again)  # the same fragment, the same patches


def read_nth(paths, i):
  return reader.decode(paths[i])


@pytest.mark.slow
@pytest.mark.parametrize('device', [False, True])
def test_patches_and_srs_lbp_are_those_the_code_before_drew(fragment_data, device):
  """In worker processes (a CPU-only machine) or with the device kernels (an accelerator):
  the same patches as the sampler before (bench/reference_patches.py) and the same SRS-LBP
  features as the numpy code, for fragments of many sizes in shared buckets."""
  from bench import reference_patches
  from retrieval.features import lbp_host
  paths = first_fragments(os.path.join(fragment_data, 'test'), 10)
  paths += first_fragments(os.path.join(fragment_data, 'train'), 4)
  names = [os.path.basename(p) for p in paths]
  read = functools.partial(read_nth, paths)  # the workers are other processes: picklable
  with contextlib.ExitStack() as stack:
    if device:
      stack.enter_context(buckets.forced_device())
    got = list(patches.extract_all(read, range(len(paths)), names, size=32, max_patches=24,
                                   ink_bounds=BOUNDS, seed=3, with_lbp=True))
  for path, name, e in zip(paths, names, got):
    rgb = reader.decode(path)
    want, _ = reference_patches.extract(rgb, name, size=32, max_patches=24, ink_bounds=BOUNDS,
                                        seed=3)
    np.testing.assert_array_equal(e.patches, want)
    np.testing.assert_array_equal(e.lbp, lbp_host.lbp_features(reader.convert(rgb, False)))
    assert e.valid_pixels == reader.valid_pixel_count(rgb)


def test_a_blank_fragment_still_gets_one_patch():
  rgb = np.full((20, 25, 3), 200, np.uint8)  # smaller than a patch, no ink at all
  got, sift, valid, _ = patches.extract(rgb, 'blank.jpg', size=32, max_patches=8,
                                        ink_bounds=BOUNDS, seed=0, descriptors=True)
  assert got.shape == (1, 32, 32) and sift.shape == (1, 128) and valid == 20 * 25


def test_cache_round_trip_at_native_size(fragment_data, tmp_path):
  config = fragment_configs.get_config('test')
  config.data.dir = fragment_data
  src = data.source(config, str(tmp_path), 'test')
  listing = data.listing(config, 'test')
  assert src.names == [os.path.basename(f.path) for f in listing.fragments]
  np.testing.assert_array_equal(src.writer_ids, listing.writer_ids)
  for f in range(len(src.names)):
    rgb = listing.read_rgb(f)
    want = patches.extract(rgb, src.names[f], size=config.input.patch_size,
                           max_patches=config.input.max_patches,
                           ink_bounds=config.input.ink_bounds, seed=config.seed).patches
    got = np.stack([src[i]['image'][..., 0] for i in range(src.starts[f], src.starts[f + 1])])
    np.testing.assert_array_equal(got, want)
    assert src.valid_pixels[f] == reader.valid_pixel_count(rgb)
  assert (src.patch_writer == src.writer_ids[src.fragment_of]).all()
  # Reused, not rebuilt: the same entry, untouched.
  assert data.source(config, str(tmp_path), 'test').path == src.path


def test_sum_and_vlad_aggregation_match_loops():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(30, 4)).astype(np.float32)
  starts = np.array([0, 5, 6, 18, 30])
  sums = aggregate.sum_pool(x, starts)
  for f in range(4):
    np.testing.assert_allclose(sums[f], x[starts[f]:starts[f + 1]].sum(0), rtol=1e-5)
  centres = rng.normal(size=(3, 4)).astype(np.float32)
  got = aggregate.vlad(x, starts, centres).reshape(4, 3, 4)
  for f in range(4):
    for c in range(3):
      rows = x[starts[f]:starts[f + 1]]
      mine = rows[np.argmin(((rows[:, None] - centres[None]) ** 2).sum(-1), 1) == c]
      residual = (mine - centres[c]).sum(0)
      want = residual / max(np.linalg.norm(residual), 1e-12) if len(mine) else residual
      np.testing.assert_allclose(got[f, c], want, rtol=1e-5, atol=1e-6)
  power = aggregate.power_l2(np.array([[4.0, -9.0]]), 0.5)
  np.testing.assert_allclose(power, [[2 / np.sqrt(13), -3 / np.sqrt(13)]], rtol=1e-6)


def sgr_reference(x, k, layers, gamma):
  """Similarity-graph re-ranking written row by row."""
  s = x @ x.T
  a = np.exp(-(1 - s) ** 2 / gamma)
  for _ in range(layers):
    a = (a + a.T) / 2
    new = a.copy()
    for i in range(len(a)):
      neighbours = np.argsort(-a[i], kind='stable')[1:k + 1]
      for j in neighbours:
        new[i] += s[i, j] * a[j]
    a = new / np.linalg.norm(new, axis=1, keepdims=True)
  d = 1 - a @ a.T
  np.fill_diagonal(d, 0)
  return d


def test_sgr_matches_a_row_by_row_reference():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(25, 6))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  got = aggregate.sgr(x, k=3, layers=2, gamma=0.5)
  np.testing.assert_allclose(got, sgr_reference(x, 3, 2, 0.5), atol=2e-5)
  assert (got == got.T).all() and (np.diag(got) == 0).all()


def test_fusion_averages_z_normalised_distances():
  rng = np.random.default_rng(2)
  a = rng.random((6, 6)); a = a + a.T
  z = aggregate.z_normalise(a)
  off = ~np.eye(6, dtype=bool)
  assert z[off].mean() == pytest.approx(0, abs=1e-6) and z[off].std() == pytest.approx(1)
  # Scale and shift do not change a method's say in the fusion.
  np.testing.assert_allclose(aggregate.fuse(a, 100 * a + 7), z, atol=1e-5)


def test_surrogate_classes_follow_the_descriptors():
  rng = np.random.default_rng(3)
  # 40 kinds of local shape (more than the 32 whitened dims, as real SIFT has), 10 each.
  centres = rng.integers(0, 120, (40, 128))
  which = np.repeat(np.arange(40), 10)
  sift = np.clip(centres[which] + rng.integers(-3, 4, (400, 128)), 0, 255).astype(np.uint8)
  labels = surrogate.cluster(sift, 40, seed=0)
  # Each cluster holds one kind: the labelling is (nearly) a relabelling of `which`.
  purity = sum(np.bincount(which[labels == c]).max() for c in np.unique(labels)) / len(which)
  assert purity >= 0.95
  np.testing.assert_array_equal(labels, surrogate.cluster(sift, 40, seed=0))


@pytest.mark.slow
def test_surrogate_training_needs_no_writer_labels(fragment_data, tmp_path):
  config = fragment_configs.get_config('test')
  config.data.dir = fragment_data
  config.train.labels = 'surrogate'
  batch = next(iter(data.train_data(config, str(tmp_path), local_batch=16)))
  assert batch['image'].shape == (16, 32, 32, 1) and batch['label'].shape == (16,)
  labels = batch['label'].reshape(4, 4)
  assert (labels == labels[:, :1]).all()  # K patches of one class per row


@pytest.mark.slow
def test_one_workdir_evaluated_on_two_datasets(fragment_data, fragment_evaluated, tmp_path):
  """Cached baselines are keyed by the data: scores on other data are that data's."""
  other = tmp_path / 'other'
  shutil.copytree(fragment_data, other)
  for name in sorted(os.listdir(other / 'test'))[::3]:  # a smaller test split
    os.remove(other / 'test' / name)
  workdir = tmp_path / 'work'
  shutil.copytree(fragment_evaluated, workdir)
  result = run_module('launch.evaluate', '--config=configs/fragments.py:test', '--data', other,
                      '--workdir', workdir)
  with open(workdir / 'eval' / 'metrics.json') as f:
    report = json.load(f)['test']
  # It ends with a table of the headline scores (the JSON stays in metrics.json), after a
  # line for each phase: the new data's patches and SRS-LBP features are computed, with
  # progress.
  table = result.stdout[result.stdout.index('\ntest (step 6):\n'):].splitlines()
  assert table[2].split() == ['method', 'writer', 'mAP', 'Top-1', 'Pr@10', 'Pr@100', 'page',
                              'mAP', 'page', 'Top-1']
  srs_lbp = next(line for line in table if line.startswith('srs_lbp '))
  assert float(srs_lbp.split()[1]) == pytest.approx(report['srs_lbp/writer/map'], abs=5e-4)
  for phase in ('extracting patches', 'embedding', "Scoring 'test'"):
    assert phase in result.stdout, phase
  assert '\r' not in result.stdout + result.stderr  # no progress bar: not a terminal
  queries = {k: v for k, v in report.items() if k.endswith('writer/num_queries')}
  assert len(set(queries.values())) == 1, queries  # every method on the same fragments
  assert queries['srs_lbp/writer/num_queries'] < len(os.listdir(os.path.join(fragment_data,
                                                                              'test')))
