"""launch.index and launch.search on a scholar's folder: nested, renamed, PNG with alpha, one
unreadable file; an index that grows with the folder; searches from inside and outside it;
the page in headless Chromium."""
import json
import os
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import needs_chromium, run_module, screenshot_in_chromium
from retrieval.collections import index as index_lib
from retrieval.fragments import reader

CONFIG = '--config=configs/fragments.py:test'
ADDED_LATER = 3


def load(workdir):
  return index_lib.load(os.path.join(workdir, 'index', 'index.npz'))


@pytest.fixture(scope='module')
def scholar(fragment_data, tmp_path_factory):
  """A collection made of the test writers' fragments, renamed into nested folders, every
  third one a PNG with a transparent outside; `later` holds fragments to add afterwards."""
  root = tmp_path_factory.mktemp('collection')
  folder, later = root / 'images', root / 'later'
  names = sorted(os.listdir(os.path.join(fragment_data, 'test')))
  for k, name in enumerate(names):
    source = os.path.join(fragment_data, 'test', name)
    target = (later if k < ADDED_LATER else folder / f'box{k % 3}' / ('sub' if k % 2 else ''))
    target.mkdir(parents=True, exist_ok=True)
    if k % 3 == 0:
      rgb = reader.decode(source)
      alpha = np.where(rgb.max(axis=-1) > reader.BLACK_THRESHOLD, 255, 0).astype(np.uint8)
      Image.fromarray(np.dstack([rgb, alpha]), 'RGBA').save(target / f'item {k}.png')
    else:
      shutil.copy(source, target / f'item {k}.JPG')
  (folder / 'box1' / 'broken.jpg').write_bytes(b'\xff\xd8 not really a JPEG')
  (folder / 'box2' / 'gone.jpg').symlink_to(root / 'moved-away.jpg')  # a link to nothing
  (folder / 'notes.txt').write_text('shelf marks')
  return folder, later


def images_in(folder):
  return sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder)
                for n in names if not n.endswith(('.txt', 'broken.jpg', 'gone.jpg')))


@pytest.fixture(scope='module')
def indexed(fragment_evaluated, scholar):
  folder, later = scholar
  workdir = fragment_evaluated
  first = run_module('launch.index', CONFIG, '--workdir', workdir, '--collection', folder)
  index, listed = load(workdir), images_in(folder)
  for name in os.listdir(later):
    shutil.copy(later / name, folder / 'box0' / name)
  second = run_module('launch.index', CONFIG, '--workdir', workdir, '--collection', folder)
  return dict(workdir=workdir, folder=folder, first=first, index=index, listed=listed,
              second=second, grown=load(workdir))


@pytest.mark.slow
def test_every_image_is_indexed_and_the_unreadable_one_named(indexed):
  folder, index = indexed['folder'], indexed['index']
  out = indexed['first'].stdout + indexed['first'].stderr
  assert sorted(index.entries.paths.tolist()) == indexed['listed']
  assert re.search(r'Skipping \S*broken\.jpg: unreadable image', out)
  assert re.search(r'Skipping \S*gone\.jpg: no such file', out)
  assert '2 unreadable' in out and 'notes.txt' in out
  assert index.header['chosen_on'].startswith('val')  # the val split's choice, not test's
  assert np.isfinite(index.entries.descriptors).all()


def test_a_rerun_embeds_only_the_added_images(indexed):
  out = indexed['second'].stdout
  total = len(images_in(indexed['folder']))
  assert f'{ADDED_LATER} embedded now, {total - ADDED_LATER} kept' in out, out
  before, after = indexed['index'].entries, indexed['grown'].entries
  rows = {p: r for r, p in enumerate(after.paths.tolist())}
  kept = [rows[p] for p in before.paths.tolist()]
  np.testing.assert_array_equal(after.descriptors[kept], before.descriptors)


@pytest.mark.slow
def test_a_removed_image_leaves_the_index_and_another_setting_rebuilds_it(indexed, tmp_path):
  folder = tmp_path / 'fewer'
  shutil.copytree(indexed['folder'], folder, symlinks=True)
  workdir = tmp_path / 'workdir'
  shutil.copytree(indexed['workdir'], workdir, ignore=shutil.ignore_patterns('index'))
  run_module('launch.index', CONFIG, '--workdir', workdir, '--collection', folder)
  gone = images_in(folder)[0]
  os.remove(folder / gone)
  out = run_module('launch.index', CONFIG, '--workdir', workdir, '--collection', folder).stdout
  assert '0 embedded now' in out and '1 no longer in the folder dropped' in out
  assert gone not in load(workdir).entries.paths.tolist()
  out = run_module('launch.index', CONFIG, '--config.input.max_patches=4', '--workdir', workdir,
                   '--collection', folder).stdout
  assert 'rebuilding it whole' in out and f'{len(images_in(folder))} embedded now' in out


@pytest.mark.slow
def test_search_inside_and_outside_the_collection(indexed, tmp_path):
  workdir, folder = indexed['workdir'], indexed['folder']
  paths = indexed['grown'].entries.paths.tolist()
  inside = paths[0]
  # The same file outside the folder (its name seeds its patches, as inside).
  outside = tmp_path / 'elsewhere' / os.path.basename(paths[1])
  outside.parent.mkdir()
  shutil.copy(folder / paths[1], outside)
  page = tmp_path / 'found.html'
  out = run_module('launch.search', '--workdir', workdir, '--query', folder / inside, outside,
                   '--top', 5, '--out', page).stdout
  blocks = out.split('\nQuery ')[1:]
  assert len(blocks) == 2
  ranked = [[line.split(None, 2)[2] for line in b.splitlines()[1:]
             if re.match(r'\s+\d+\.', line)] for b in blocks]
  distances = [[float(line.split()[1]) for line in b.splitlines()[1:]
                if re.match(r'\s+\d+\.', line)] for b in blocks]
  assert 'in the collection' in blocks[0] and 'outside the collection' in blocks[1]
  assert inside not in ranked[0] and len(ranked[0]) == 5
  assert ranked[1][0] == paths[1]  # embedded afresh, it finds its own copy first
  assert all(d == sorted(d) for d in distances)
  html = page.read_text()
  assert inside in html and paths[1] in html
  assert not re.search(r'<(script|link)\b|src="(?!data:)', html)  # self-contained


def test_closest_pairs_of_the_collection(indexed, tmp_path):
  page = tmp_path / 'pairs.html'
  out = run_module('launch.search', '--workdir', indexed['workdir'], '--query-collection',
                   '--top', 4, '--out', page).stdout
  rows = [line.split(None, 2) for line in out.splitlines() if re.match(r'\s+\d+\.', line)]
  assert len(rows) == 4
  distances = [float(r[1]) for r in rows]
  assert distances == sorted(distances)
  pairs = [tuple(r[2].split('  <->  ')) for r in rows]
  assert all(a != b for a, b in pairs) and len(set(pairs)) == 4
  assert page.exists()


@pytest.mark.slow
@needs_chromium
def test_the_search_page_renders_in_headless_chromium(indexed, tmp_path):
  page = tmp_path / 'page.html'
  paths = indexed['grown'].entries.paths.tolist()
  run_module('launch.search', '--workdir', indexed['workdir'], '--query',
             indexed['folder'] / paths[2], '--top', 6, '--out', page)
  image = screenshot_in_chromium(page, tmp_path, (1000, 800))
  colours = np.unique(image.reshape(-1, 3)[::5], axis=0)
  assert len(colours) > 100  # the query and its matches drawn, not a blank page


@pytest.mark.slow
def test_training_without_labels_on_the_collection_then_indexing_it(scholar, tmp_path):
  """What a scholar runs to adapt the encoder to their own folder first (surrogate classes:
  no names to read writers from, nothing to score, settings from the config)."""
  folder, _ = scholar
  workdir = tmp_path / 'mine'
  overrides = ['--config=configs/fragments.py:size=test,data=collection',
               '--config.train.surrogate_classes=8']
  trained = run_module('launch.train', *overrides, '--data', folder, '--workdir', workdir)
  for name, why in (('broken', 'unreadable image'), ('gone', 'no such file')):
    assert re.search(fr'Skipping \S*{name}\.jpg: {why}', trained.stdout + trained.stderr)
  run_module('launch.index', *overrides, '--workdir', workdir, '--collection', folder)
  index = load(workdir)
  assert index.header['chosen_on'].startswith('the config')
  assert sorted(index.entries.paths.tolist()) == images_in(folder)


@pytest.mark.slow
def test_an_interrupted_index_keeps_its_chunks_and_the_rerun_goes_on(indexed, tmp_path,
                                                                     monkeypatch):
  from bengrapheme import errors, restored
  from configs import fragments
  from retrieval.collections import collection
  config = fragments.get_config('test')
  _, model = restored.trained_model(config, indexed['workdir'])
  listing = collection.list_images(str(indexed['folder']))
  folder = tmp_path / 'index'
  monkeypatch.setattr(index_lib, 'CHUNK', 4)
  save, saved = index_lib._save_npz, []

  def save_then_stop(path, arrays):  # Ctrl-C once two chunks are kept
    save(path, arrays)
    saved.append(path)
    if sum('chunk-' in str(p) for p in saved) == 2:
      raise KeyboardInterrupt

  monkeypatch.setattr(index_lib, '_save_npz', save_then_stop)
  with pytest.raises(errors.Interrupted, match='rerun the same command to go on'):
    index_lib.build(config, model, indexed['workdir'], listing, str(folder))
  assert not (folder / 'index.npz').exists()  # whole or not at all
  monkeypatch.setattr(index_lib, '_save_npz', save)
  index, counts = index_lib.build(config, model, indexed['workdir'], listing, str(folder))
  assert counts['reused'] == 8 and counts['embedded'] == len(listing.paths) - 2 - 8  # 2 unreadable
  assert not (folder / 'partial').exists()
  grown = indexed['grown'].entries
  rows = {p: r for r, p in enumerate(grown.paths.tolist())}
  np.testing.assert_allclose(index.entries.descriptors,
                             grown.descriptors[[rows[p] for p in index.entries.paths]],
                             rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_training_evaluations_log_the_val_choice_that_the_index_reads(fragment_data, scholar,
                                                                      tmp_path):
  """Without launch.evaluate: the val choice of the last in-training evaluation, from
  metrics.jsonl (the split that chose is a label, kept out of the curves)."""
  workdir = tmp_path / 'workdir'
  run_module('launch.train', CONFIG, '--data', fragment_data, '--workdir', workdir,
             '--config.evals.val.every=6')
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert any('val/tuned_settings/fusion_weight' in row for row in rows)
  run_module('launch.index', CONFIG, '--workdir', workdir, '--collection', scholar[0])
  assert load(workdir).header['chosen_on'] == 'val (checkpoint step 6)'


@pytest.mark.slow
def test_two_processes_build_the_index_one_process_builds(indexed, tmp_path):
  """launch.index as one jax.distributed job of 2 processes (launch.local): each embeds its
  slice of the images, process 0 fits the SRS-LBP PCA before and merges after."""
  args = ['launch.index', CONFIG, '--workdir', indexed['workdir'], '--collection',
          indexed['folder']]
  run_module(*args, '--index', tmp_path / 'one')
  two = run_module('launch.local', '--processes', '2', '--devices-per-process', '1', '--',
                   *args, '--index', tmp_path / 'two')
  one = index_lib.load(str(tmp_path / 'one' / 'index.npz'))
  both = index_lib.load(str(tmp_path / 'two' / 'index.npz'))
  from retrieval.collections import collection
  n = len(collection.list_images(str(indexed['folder'])).paths)  # the 2 unreadable ones too
  # Process 0 (the one that prints) embedded its half; the job, every readable image.
  assert re.findall(r'embedding ([\d,]+) images', two.stdout) == [str(n - n // 2)]
  assert f'{n - 2:,} embedded now' in two.stdout
  np.testing.assert_array_equal(both.entries.paths, one.entries.paths)
  np.testing.assert_allclose(both.entries.descriptors, one.entries.descriptors, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_array_equal(both.entries.lbp, one.entries.lbp)
  np.testing.assert_array_equal(both.lbp_pca.components, one.lbp_pca.components)
  assert not (tmp_path / 'two' / 'partial').exists()


@pytest.mark.slow
def test_another_checkpoint_at_the_same_step_is_not_taken_for_the_indexed_one(
    indexed, fragment_data, tmp_path):
  """A workdir whose checkpoint is another run's at the same step (a copy retrained, or two
  workdirs sharing one index): the index is rebuilt, and a search refuses it until then."""
  retrained = tmp_path / 'retrained'
  run_module('launch.train', CONFIG, '--config.seed=1', '--data', fragment_data, '--workdir',
             retrained)
  workdir = tmp_path / 'workdir'
  shutil.copytree(indexed['workdir'], workdir)  # its index and val's choice, kept
  shutil.rmtree(workdir / 'checkpoints')
  shutil.copytree(retrained / 'checkpoints', workdir / 'checkpoints')
  outside = tmp_path / 'query.jpg'
  shutil.copy(indexed['folder'] / indexed['grown'].entries.paths[0], outside)
  refused = run_module('launch.search', '--workdir', workdir, '--query', outside, check=False)
  assert refused.returncode == 1
  assert 'the index was built with another checkpoint (step 6' in refused.stderr
  out = run_module('launch.index', CONFIG, '--workdir', workdir, '--collection',
                   indexed['folder']).stdout
  assert 'rebuilding it whole' in out
  run_module('launch.search', '--workdir', workdir, '--query', outside)  # as the refusal said


def ranked_blocks(out):
  """Per query of launch.search's text: [(path, distance)] in rank order."""
  return [[(line.split(None, 2)[2], float(line.split()[1])) for line in block.splitlines()[1:]
           if re.match(r'\s+\d+\.', line)] for block in out.split('\nQuery ')[1:]]


@pytest.mark.slow
def test_a_query_changed_since_indexing_is_embedded_afresh(indexed, tmp_path):
  """An indexed file whose content changed is searched as it is now (its stale descriptor
  unused): as its new content would be from outside the folder, under the same name."""
  folder, paths = indexed['folder'], indexed['grown'].entries.paths.tolist()
  jpgs = [p for p in paths if p.endswith('.JPG')]
  changed, other = folder / jpgs[0], folder / jpgs[-1]
  outside = tmp_path / 'elsewhere' / os.path.basename(jpgs[0])  # the name seeds the patches
  outside.parent.mkdir()
  shutil.copy(other, outside)
  kept, times = changed.read_bytes(), os.stat(changed)
  try:
    shutil.copy(other, changed)
    out = run_module('launch.search', '--workdir', indexed['workdir'], '--query', changed,
                     outside, '--top', 5, '--out', tmp_path / 'found.html').stdout
  finally:
    changed.write_bytes(kept)
    os.utime(changed, ns=(times.st_atime_ns, times.st_mtime_ns))
  assert f'{changed} changed since it was indexed: embedded afresh' in out
  now, fresh = ranked_blocks(out)
  assert now == fresh and now[0][0] == jpgs[-1]  # its new content's own copy, first


@pytest.mark.slow
def test_the_index_holds_the_evaluators_descriptors(fragment_evaluated, fragment_data, tmp_path):
  """The test split's files indexed as a collection: each image's descriptor is the one the
  evaluator scores it by (the same patches, embeddings, sum and the val-chosen power)."""
  from bengrapheme import restored
  from configs import fragments
  from retrieval.features import aggregate
  from retrieval.fragments import data, evaluate
  workdir = tmp_path / 'workdir'
  shutil.copytree(fragment_evaluated, workdir, ignore=shutil.ignore_patterns('index'))
  folder = os.path.join(fragment_data, 'test')
  run_module('launch.index', CONFIG, '--workdir', workdir, '--collection', folder)
  index = load(workdir)
  config = fragments.get_config('test')
  config.data.dir = fragment_data
  _, model = restored.trained_model(config, str(workdir))
  src = data.source(config, str(workdir), 'test')
  expected = aggregate.fragment_descriptors(
      evaluate.patch_embeddings(config, model, src), src.starts, method='sum',
      alpha=index.header['settings']['power'])
  rows = {p: r for r, p in enumerate(index.entries.paths.tolist())}
  assert sorted(rows) == sorted(src.names)
  np.testing.assert_allclose(index.entries.descriptors[[rows[n] for n in src.names]], expected,
                             rtol=1e-5, atol=1e-6)
