"""Prepared data, built once from its source files and shared by every run and process.

A cache entry is the folder CACHE_DIR/NAME-KEY. KEY hashes `params` (a layout version, the
sizes it was built for) and the source files' names, sizes and mtimes, so a changed file or
setting gets a new folder, and an unchanged one is reused without reading a byte of it. An
entry is built under a temporary name, its files fsynced, then renamed into place
(bengrapheme/files.py), so a crash or a full disk never leaves a half-built folder under a
name that would be reused; `cache.json`, written last, marks it complete.

On a multi-process job process 0 builds while the others wait at a barrier; a process that
then finds no entry (its cache dir is not shared with process 0's host) builds its own.
Processes that build at once each build a copy and the first rename wins.
"""
import hashlib
import json
import os
import pathlib
import shutil

import jax
from jax.experimental import multihost_utils

from bengrapheme import files

MARKER = 'cache.json'


def build_once(cache_dir, name, source_files, params, build, *, origin):
  """The complete entry NAME-KEY in `cache_dir` (a pathlib.Path), built first if needed.

  source_files: the files the entry is made from (their stat is part of the key); params:
  JSON-serialisable settings that change the content; build(folder): writes the entry's
  files into an empty folder; origin: where the data comes from (e.g. the data folder):
  entries of the same name and origin with another key are stale and removed.
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
  stats = [(os.path.basename(p), os.stat(p).st_size, os.stat(p).st_mtime_ns)
           for p in map(str, source_files)]
  return hashlib.sha256(json.dumps([name, params, stats]).encode()).hexdigest()[:16]


def is_complete(entry):
  return (pathlib.Path(entry) / MARKER).exists()


def _build_if_missing(entry, build, meta):
  if is_complete(entry):
    return
  entry.parent.mkdir(parents=True, exist_ok=True)
  files.remove_abandoned(entry.parent)
  try:
    with files.atomic_dir(entry) as tmp:
      build(tmp)
      (tmp / MARKER).write_text(json.dumps(meta, indent=1))
  except FileExistsError:
    if not is_complete(entry):  # what another process renamed into place must be whole
      raise
  _remove_stale(entry, meta)


def _remove_stale(entry, meta):
  """Removes entries of the same name and origin with another key (a file changed since)."""
  for path in entry.parent.glob(f'{meta["name"]}-*'):
    try:
      other = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
      continue
    if path != entry and (other.get('name'), other.get('origin')) == (meta['name'],
                                                                       meta['origin']):
      shutil.rmtree(path, ignore_errors=True)
