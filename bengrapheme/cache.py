"""Prepared data, built once from its source files and shared by every run and process.

A cache entry is the folder CACHE_DIR/NAME-KEY. KEY hashes `params` (a layout version, the
sizes it was built for) and the source files' names, sizes and mtimes, so a changed file or
setting gets a new folder, and an unchanged one is reused without reading its sources. An
entry is built under a temporary name, its files fsynced, then renamed into place
(bengrapheme/files.py), so a crash or a full disk never leaves a half-built folder under a
name that would be reused; `cache.json`, written last, marks it complete. A build that fills
the disk removes its temporary folder and raises files.OutOfSpace saying so.

`cache.json` also holds every file's size and a cheap fingerprint (a hash of
18 blocks spread over the file: ~1 MB read whatever its size). An entry is checked
against them each time it is opened, so one whose files were truncated or replaced since it
was built is named, removed and rebuilt rather than read as garbage. A change confined to
bytes between the sampled blocks goes unnoticed: the check is for damage, not tampering.

On a multi-process job process 0 builds while the others wait at a barrier; a process that
then finds no entry (its cache dir is not shared with process 0's host) builds its own.
Processes that build at once each build a copy and the first rename wins.
"""
import hashlib
import json
import os
import pathlib
import shutil
import time

import jax
from jax.experimental import multihost_utils

from bengrapheme import console, errors, files

MARKER = 'cache.json'


def build_once(cache_dir, name, source_files, params, build, *, origin):
  """The complete entry NAME-KEY in `cache_dir` (a pathlib.Path), built first if needed.

  source_files: the files the entry is made from (their stat is part of the key); params:
  JSON-serialisable settings that change the content; build(folder): writes the entry's
  files into an empty folder; origin: where the data comes from (e.g. the data folder):
  entries of the same name, origin and params with another key were built from source files
  since changed, and are removed. Entries of other params are kept: a sweep's trials take
  turns over them (patch sizes, scales) and each is built once.
  """
  cache_dir = pathlib.Path(cache_dir)
  key = key_of(name, source_files, params)
  entry = cache_dir / f'{name}-{key}'
  if jax.process_index() == 0:
    _build_if_missing(entry, build, dict(name=name, key=key, origin=str(origin), params=params))
  multihost_utils.sync_global_devices(f'cache {entry.name}')
  if jax.process_index() != 0:
    _build_if_missing(entry, build, dict(name=name, key=key, origin=str(origin), params=params))
  return entry


def key_of(name, source_files, params):
  """16 hex digits naming what is computed from `source_files` (their names, sizes and
  mtimes) with `params`: also the key of results kept outside a cache dir."""
  stats = [(os.path.basename(p), *_size_and_mtime(p)) for p in map(str, source_files)]
  return hashlib.sha256(json.dumps([name, params, stats]).encode()).hexdigest()[:16]


def _size_and_mtime(path):
  """-1s for a file gone since it was listed: its reader then names it (a collection skips
  it, counted, as any unreadable image)."""
  try:
    stat = os.stat(path)
  except FileNotFoundError:
    return -1, -1
  return stat.st_size, stat.st_mtime_ns


def is_complete(entry):
  return (pathlib.Path(entry) / MARKER).exists()


def damage(entry):
  """Why the files of the complete `entry` differ from what was built; None when they match."""
  try:
    built = json.loads((entry / MARKER).read_text())['files']
  except (OSError, ValueError, KeyError) as e:
    return f'{entry / MARKER} does not list the sizes and fingerprints of its files ({e})'
  for name, (size, fingerprint) in sorted(built.items()):
    path = entry / name
    if not path.is_file():
      return f'{path} is missing'
    if path.stat().st_size != size:
      return (f'{path} holds {path.stat().st_size:,} bytes, {size:,} when it was built '
              '(truncated or replaced)')
    if _fingerprint(path) != fingerprint:
      return f'{path} has other content than when it was built (its fingerprint differs)'
  return None


BLOCK, BLOCKS = 64 << 10, 18


def _fingerprint(path):
  """sha256 of BLOCKS blocks of BLOCK bytes evenly spread from the start to the end of the
  file (the whole of a smaller file): cheap enough to check a 6 GB file on every open."""
  size = path.stat().st_size
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    if size <= BLOCK * BLOCKS:
      digest.update(f.read())
    else:
      for i in range(BLOCKS):
        f.seek(i * (size - BLOCK) // (BLOCKS - 1))
        digest.update(f.read(BLOCK))
  return digest.hexdigest()[:32]


def _build_if_missing(entry, build, meta):
  if is_complete(entry):
    problem = damage(entry)
    if problem is None:
      return
    print(f'Prepared data {entry} is damaged: {problem}. Removing and rebuilding it.',
          flush=True)
    _remove(entry)
  entry.parent.mkdir(parents=True, exist_ok=True)
  files.remove_abandoned(entry.parent)
  console.say(f'Building {entry} (once: reused while its sources and settings are unchanged)...')
  start = time.perf_counter()
  try:
    with errors.on_ctrl_c(f'Interrupted (Ctrl-C) while building {entry}: the partial build '
                          'was removed, nothing half-built is left; rerunning builds it '
                          'again.'), files.atomic_dir(entry) as tmp:
      build(tmp)
      built = {str(path.relative_to(tmp)): (path.stat().st_size, _fingerprint(path))
               for path in sorted(tmp.rglob('*')) if path.is_file()}
      (tmp / MARKER).write_text(json.dumps(dict(meta, files=built), indent=1))
  except FileExistsError:
    if not is_complete(entry):  # what another process renamed into place must be whole
      raise
  except Exception as e:  # pylint: disable=broad-except
    if files.out_of_space(e):
      raise files.OutOfSpace(
          f'{entry}: the disk filled up while building it ({files.space_left(entry.parent)}; '
          f'{type(e).__name__}: {e}). The partial build was removed: nothing half-built is '
          'left. Free space there (or set config.data.cache_dir to a larger disk) and rerun; '
          'the build starts over.') from e
    raise
  console.say(f'Built {entry.name} in {console.duration(time.perf_counter() - start)}.')
  _remove_stale(entry, meta)


def _remove(entry):
  """Takes a damaged entry out of its name at once (a rename), then deletes it; a crash in
  between leaves a temporary that files.remove_abandoned deletes later."""
  doomed = entry.parent / files.temporary_name(f'{entry.name}.damaged')
  try:
    entry.rename(doomed)
  except FileNotFoundError:  # another process took it away first
    return
  shutil.rmtree(doomed, ignore_errors=True)


def _remove_stale(entry, meta):
  """Removes entries of the same name, origin and params with another key: built from source
  files that have changed since, they can never be used again."""
  for path in entry.parent.glob(f'{meta["name"]}-*'):
    try:
      other = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
      continue
    mine = json.loads(json.dumps(meta))  # tuples read back as lists
    same = all(other.get(k) == mine[k] for k in ('name', 'origin', 'params'))
    if path != entry and same:
      shutil.rmtree(path, ignore_errors=True)
