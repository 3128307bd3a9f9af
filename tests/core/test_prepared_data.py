"""Prepared data (bengrapheme/cache.py entries) survive damage after the build and a full disk.

A file truncated or replaced after its entry was built is named when the entry is opened and
the entry rebuilt; a build that fills its disk leaves nothing half-built, says so, and a
rerun after space is freed builds it whole. The mechanism is tested on a cheap stand-in build,
then once on each real cache (prepare's Kaggle conversion, the fragment patches). The
full-disk cases mount a small tmpfs, which needs root (CI runs as root).
"""
import numpy as np
import pytest

from bengrapheme import cache, errors, files
from bengrapheme.grapheme import prepare

SIZE = 3 << 20  # above the 18 x 64 KiB that are hashed whole: the fingerprint samples blocks


def build(folder):
  """A stand-in entry: a large file written through a memory map, and a small one."""
  images = files.open_memmap(folder / 'images.npy', np.uint8, (SIZE,))
  images[:] = np.random.default_rng(0).integers(0, 256, SIZE, np.uint8)
  images.flush()
  del images
  (folder / 'index.json').write_text('{"ids": [1, 2, 3]}')


def entry_in(cache_dir, source):
  return cache.build_once(cache_dir, 'split', [source], 1, build, origin='data')


@pytest.fixture
def source(tmp_path):
  path = tmp_path / 'source.bin'
  path.write_bytes(b'source')
  return path


def reopen_after(damage, cache_dir, source, name, capsys):
  """Builds an entry, damages its file `name`, reopens it; returns what was printed."""
  entry = entry_in(cache_dir, source)
  intact = (entry / name).read_bytes()
  damage(entry / name, intact)
  assert entry_in(cache_dir, source) == entry
  out = capsys.readouterr().out
  assert f'Prepared data {entry} is damaged: {entry / name}' in out, out
  assert (entry / name).read_bytes() == intact  # rebuilt whole
  assert [p.name for p in cache_dir.iterdir()] == [entry.name]  # nothing left beside it
  return out


def test_truncated_file_is_named_and_rebuilt(tmp_path, source, capsys):
  out = reopen_after(lambda path, intact: path.write_bytes(intact[:SIZE // 2]),
                     tmp_path / 'cache', source, 'images.npy', capsys)
  assert 'bytes, 3,145,856 when it was built (truncated or replaced)' in out


def overwrite_one_place(path, intact):
  """Same size, other bytes in one place only: a file replaced by another of its size."""
  changed = bytearray(intact)
  changed[20_000:20_100] = bytes(255 - b for b in changed[20_000:20_100])
  path.write_bytes(bytes(changed))


@pytest.mark.parametrize('name', ['images.npy', 'index.json'])
def test_replaced_content_of_the_same_size_is_detected(name, tmp_path, source, capsys):
  damage = (overwrite_one_place if name == 'images.npy' else
            lambda path, intact: path.write_bytes(intact[::-1]))
  out = reopen_after(damage, tmp_path / 'cache', source, name, capsys)
  assert 'has other content than when it was built (its fingerprint differs)' in out


def test_an_intact_entry_is_reused_untouched(tmp_path, source, capsys):
  entry = entry_in(tmp_path, source)
  before = {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}
  assert entry_in(tmp_path, source) == entry
  assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()} == before
  assert 'damaged' not in capsys.readouterr().out


def test_entries_of_other_settings_are_kept_and_outdated_ones_removed(tmp_path, source):
  """A sweep's trials take turns over settings (patch sizes, scales): each entry is built once
  and kept; one whose source files changed since is removed when its rebuild is done."""
  first = cache.build_once(tmp_path / 'cache', 'split', [source], 1, build, origin='data')
  other = cache.build_once(tmp_path / 'cache', 'split', [source], 2, build, origin='data')
  assert first != other and cache.is_complete(first) and cache.is_complete(other)
  source.write_bytes(b'changed')
  rebuilt = cache.build_once(tmp_path / 'cache', 'split', [source], 1, build, origin='data')
  assert sorted(p.name for p in (tmp_path / 'cache').iterdir()) == sorted([rebuilt.name, other.name])


def assert_out_of_space_said_so(error, cache_dir):
  message = str(error.value)
  assert str(cache_dir) in message and 'MiB free of' in message, message
  assert 'nothing half-built is left' in message, message
  assert list(cache_dir.iterdir()) == []  # no temporary folder, no entry


def test_ctrl_c_while_building_says_so_and_leaves_nothing(tmp_path, source):
  def interrupted_build(folder):
    (folder / 'images.npy').write_bytes(b'half')
    raise KeyboardInterrupt

  with pytest.raises(errors.Interrupted) as stopped:
    cache.build_once(tmp_path / 'cache', 'split', [source], 1, interrupted_build,
                     origin='data')
  assert str(stopped.value).startswith('Interrupted (Ctrl-C) while building ')
  assert 'nothing half-built is left' in str(stopped.value)
  assert list((tmp_path / 'cache').iterdir()) == []
  entry = entry_in(tmp_path / 'cache', source)  # the rerun builds it whole
  assert cache.damage(entry) is None


def test_out_of_space_leaves_nothing_and_a_rerun_builds(small_disk, source):
  disk = small_disk('1m')  # room for the small file, not the large one
  with pytest.raises(files.OutOfSpace) as error:
    entry_in(disk / 'cache', source)
  assert_out_of_space_said_so(error, disk / 'cache')
  disk = small_disk('8m')
  entry = entry_in(disk / 'cache', source)
  assert cache.damage(entry) is None
  assert [p.name for p in (disk / 'cache').iterdir()] == [entry.name]


@pytest.mark.slow
def test_prepare_out_of_space_then_rebuilt_then_damaged(grapheme_data, small_disk, capsys):
  """The Kaggle conversion (images written through a memory map, which would die of SIGBUS
  on a full disk without the allocation up front)."""
  disk = small_disk('1m')
  with pytest.raises(files.OutOfSpace) as error:
    prepare.prepare(grapheme_data, 'train', disk / 'cache')
  assert_out_of_space_said_so(error, disk / 'cache')
  assert 'allocating' in str(error.value)

  disk = small_disk('16m')
  entry = prepare.prepare(grapheme_data, 'train', disk / 'cache')
  first = prepare.GraphemeSource(entry)[5]['image']
  with open(entry / 'images.npy', 'r+b') as f:
    f.truncate(1000)
  assert prepare.prepare(grapheme_data, 'train', disk / 'cache') == entry
  assert f'{entry / "images.npy"} holds 1,000 bytes' in capsys.readouterr().out
  np.testing.assert_array_equal(prepare.GraphemeSource(entry)[5]['image'], first)


def test_fragment_cache_out_of_space_leaves_nothing(fragment_data, small_disk):
  import configs.fragments
  from retrieval.fragments import data
  config = configs.fragments.get_config('test')
  config.data.dir, config.data.cache_dir = fragment_data, str(small_disk('64k') / 'cache')
  with pytest.raises(files.OutOfSpace) as error:
    data.source(config, 'unused', 'test')
  assert_out_of_space_said_so(error, small_disk('64k') / 'cache')
