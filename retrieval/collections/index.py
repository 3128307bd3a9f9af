"""The index of a collection (launch.index): one descriptor per image, for launch.search.

Each image of the collection (retrieval/collections/collection.py) gets the evaluator's fragment
descriptor: its patches at its own resolution (retrieval/features/patches.py) embedded by the trained
encoder, summed, power-normalised and L2-normalised (retrieval/features/aggregate.py); and, when the
settings fuse SRS-LBP, its SRS-LBP embedding (retrieval/features/lbp.py, with a PCA fitted on a sample
of the collection itself: no labels needed). The settings are those the val split chose for
this checkpoint (retrieval/fragments/evaluate.py's method 'tuned'), read from the workdir's scores, or
the config's own when it has no val split (a collection trained with surrogate classes).

INDEX/index.npz holds everything search reads: the paths relative to the collection folder,
each file's size and modification time, the descriptors, the SRS-LBP embeddings and their
PCA, and a header (checkpoint step, settings, the config, the collection folder). A rerun
embeds only the images whose path, size or time is new, drops those no longer there, and
rebuilds everything when the checkpoint, a setting or the config changed. index.npz is
replaced whole or not at all; meanwhile the images embedded so far are kept in
INDEX/partial/, a chunk at a time, so an interrupted run loses at most one chunk and its
rerun goes on from there.
"""
import collections
import dataclasses
import hashlib
import io
import itertools
import json
import os
import shutil
import zipfile

import jax
import numpy as np
from jax.experimental import multihost_utils

from bengrapheme import console, errors, inference, files, workdir_lock
from retrieval.features import aggregate, lbp, patches, pca
from retrieval.collections import collection
from retrieval.fragments import evaluate

LAYOUT = 1  # bump when index.npz changes
CHUNK = 256  # images embedded, then kept in partial/, at a time


@dataclasses.dataclass
class Entries:
  """Indexed images: row i is paths[i] (relative to the collection folder)."""
  paths: np.ndarray  # str [N]
  sizes: np.ndarray  # int64 [N]: bytes
  mtimes: np.ndarray  # int64 [N]: modification time, ns
  descriptors: np.ndarray  # float32 [N, D]
  lbp: np.ndarray  # float32 [N, L]; L = 0 without SRS-LBP fusion

  @staticmethod
  def empty(dims=0, lbp_dims=0):
    return Entries(np.array([], str), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros((0, dims), np.float32), np.zeros((0, lbp_dims), np.float32))

  @staticmethod
  def concat(parts):
    return Entries(*[np.concatenate([getattr(p, f.name) for p in parts])
                     for f in dataclasses.fields(Entries)])

  def take(self, rows):
    return Entries(*[getattr(self, f.name)[rows] for f in dataclasses.fields(Entries)])

  def arrays(self):
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(Entries)}


@dataclasses.dataclass
class Index:
  header: dict  # step, settings, chosen_on, fingerprint, config (JSON), root, layout
  entries: Entries
  lbp_pca: pca.PCA | None


def checkpoint_digest(model):
  """16 hex digits of the model's variables: which checkpoint the descriptors came from (two
  workdirs at one step, or a retrained one, differ). The model's variables must all be on this
  process (inference.process_local on a multi-process job)."""
  digest = hashlib.sha256()
  for leaf in jax.device_get(jax.tree.leaves(model.variables)):
    digest.update(np.ascontiguousarray(leaf).tobytes())
  return digest.hexdigest()[:16]


def fingerprint(config, step, digest, settings):
  """What the descriptors depend on: a different value rebuilds the index."""
  return json.dumps(dict(layout=LAYOUT, step=int(step), checkpoint=digest,
                         settings=settings, seed=config.seed, model=config.model.to_dict(),
                         input=config.input.to_dict(), aggregation=config.eval.aggregation),
                    sort_keys=True, default=str)


def _save_npz(path, arrays):
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  files.write_atomic(path, buffer.getvalue())


def _pca_arrays(fitted):
  return {} if fitted is None else {f'lbp_pca_{k}': v for k, v in fitted._asdict().items()}


def _pca_of(arrays):
  if 'lbp_pca_mean' not in arrays:
    return None
  return pca.PCA(*[arrays[f'lbp_pca_{k}'] for k in pca.PCA._fields])


def save(path, index):
  _save_npz(path, {'header': np.array(json.dumps(index.header)), **index.entries.arrays(),
                   **_pca_arrays(index.lbp_pca)})


class Unreadable(errors.UserError):
  """An index.npz this version cannot read: damaged, or of another layout (`why`)."""

  def __init__(self, path, why):
    super().__init__(f'{path}: {why}; rebuild it with python -m launch.index')
    self.why = why


def load(path):
  """The Index in `path` (an index.npz); UserError naming it when it is missing or damaged."""
  if not os.path.isfile(path):
    raise errors.UserError(f'{path}: no index; build it first (python -m launch.index '
                           '--workdir W --collection DIR)')
  try:
    with np.load(path) as z:
      arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays.pop('header')))
    entries = Entries(*[arrays[f.name] for f in dataclasses.fields(Entries)])
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    raise Unreadable(path, f'not an index this version reads ({e})') from e
  if header.get('layout') != LAYOUT:
    raise Unreadable(path, f'index layout {header.get("layout")}, this version reads {LAYOUT}')
  return Index(header, entries, _pca_of(arrays))


# ------------------------------------------------------------------ settings


def chosen_settings(config, workdir, step):
  """(settings, where they were chosen): the val split's choice for checkpoint `step`, read
  from WORKDIR/eval/metrics.json or the training log; the config's own settings when it has
  no split to choose on, or no choice recorded for this checkpoint (the second item says
  which)."""
  if config.eval.aggregation != 'sum':
    raise errors.UserError(f"eval.aggregation={config.eval.aggregation!r}: an index sums "
                           "the patch embeddings ('sum'); VLAD's centres are fitted on a "
                           'whole set, which an index that grows cannot keep')
  split = config.eval.tune_split
  if not split:
    return evaluate.configured_settings(config), 'the config (it names no split to tune on)'
  rows = []
  scores = json.loads(files.read_text(files.join(workdir, 'eval', 'metrics.json')) or '{}')
  if scores.get('step') == step:
    rows.append(scores.get(split, {}))
  for line in (files.read_text(files.join(workdir, 'metrics.jsonl')) or '').splitlines():
    row = json.loads(line)
    if row.get('step') == step:
      rows.append({k[len(split) + 1:]: v for k, v in row.items() if k.startswith(split + '/')})
  for row in rows:
    if all(f'tuned_settings/{name}' in row for name in evaluate.SETTINGS):
      settings = {name: row[f'tuned_settings/{name}'] for name in evaluate.SETTINGS}
      settings.update(whitening_dims=int(settings['whitening_dims']),
                      rerank_k=int(settings['rerank_k']))
      return settings, f'{split} (checkpoint step {step})'
  return evaluate.configured_settings(config), (
      f'the config, as no choice on split {split!r} is recorded for the checkpoint of step '
      f'{step} (python -m launch.evaluate --data DATA --workdir {workdir} records one)')


# ------------------------------------------------------------------ embedding


class _Patches:
  """Patches [n, S, S] as the records inference.outputs_by_source reads."""

  def __init__(self, rows):
    self.rows = rows

  def __len__(self):
    return len(self.rows)

  def __getitem__(self, i):
    return dict(image=self.rows[i][..., None], index=np.int32(i))


def _extract(config, paths, with_lbp):
  i = config.input
  return patches.extract_all(collection.read_fragment, paths,
                             [os.path.basename(p) for p in paths], size=i.patch_size,
                             max_patches=i.max_patches, ink_bounds=i.ink_bounds,
                             seed=config.seed, with_lbp=with_lbp,
                             skip=(collection.Unreadable,))


def lbp_sample_pca(config, paths, seed):
  """(the SRS-LBP PCA (as the evaluator's, 200 dims) fitted on up to eval.lbp_fit_fragments
  images drawn from `paths` (absolute), {path: their patches and features, which `embed`
  then reuses}); images that cannot be read are left to the main pass to report."""
  order = np.random.default_rng(seed).permutation(len(paths))[:config.eval.lbp_fit_fragments]
  sample = [paths[i] for i in order]
  found = {}
  with console.Progress(len(order), 'SRS-LBP features for its PCA', unit='image') as progress:
    for path, e in zip(sample, _extract(config, sample, with_lbp=True)):
      if not isinstance(e, str):
        found[path] = e
      progress.update()
  if len(found) < 2:
    raise errors.UserError('SRS-LBP fusion needs at least 2 readable images to fit its PCA')
  features = np.stack([e.lbp for e in found.values()])
  return pca.fit(features, min(200, len(features) - 1, features.shape[1])), found


def _windows(items, size):
  items = iter(items)
  while window := list(itertools.islice(items, size)):
    yield window


def embed(config, model, settings, lbp_pca, jobs, on_chunk, progress=None, known=None):
  """Embeds the images `jobs` [(path, name seeding its patches)] in chunks of CHUNK:
  on_chunk(rows, entries, problems) gets, for each chunk in order, the rows of `jobs` it
  embedded, their Entries (paths as given; sizes and times left 0) and a message for each
  image that could not be read. known: {path: their patches and features} extracted already
  (lbp_sample_pca's)."""
  known = known or {}
  fuse = settings['fusion_weight'] > 0
  fresh = _extract(config, [path for path, _ in jobs if path not in known], with_lbp=fuse)
  extracted = (known.pop(path) if path in known else next(fresh) for path, _ in jobs)
  pending = collections.deque()

  def finish(start, results, embeddings):
    ok = [r for r, e in enumerate(results) if not isinstance(e, str)]
    counts = [len(results[r].patches) for r in ok]
    if ok:
      pooled = aggregate.sum_pool(embeddings, np.concatenate([[0], np.cumsum(counts)]))
      descriptors = aggregate.power_l2(pooled, settings['power'])
    else:
      descriptors = np.zeros((0, config.model.embedding_dim), np.float32)
    if fuse and ok:
      features = np.stack([results[r].lbp for r in ok])
      lbp_rows = lbp.embed(lbp_pca, features)
    else:
      lbp_rows = np.zeros((len(ok), lbp_pca.components.shape[0] if fuse else 0), np.float32)
    names = np.array([jobs[start + r][0] for r in ok], str)
    entries = Entries(names, np.zeros(len(ok), np.int64), np.zeros(len(ok), np.int64),
                      descriptors.astype(np.float32), lbp_rows.astype(np.float32))
    on_chunk([start + r for r in ok], entries, [e for e in results if isinstance(e, str)])
    if progress is not None:
      progress.update(len(results))

  def sources():
    for start, results in zip(itertools.count(0, CHUNK), _windows(extracted, CHUNK)):
      cuts = [e.patches for e in results if not isinstance(e, str)]
      if not cuts:
        finish(start, results, None)
        continue
      pending.append((start, results))
      yield _Patches(np.concatenate(cuts))

  for rows in inference.outputs_by_source(model, evaluate.embedding_fn(config), sources(),
                                           batch_size=config.eval.batch_size):
    finish(*pending.popleft(), rows['embedding'])


# ------------------------------------------------------------------ building


def _stat(root, paths):
  """(sizes, mtimes) of the images; -1 for one gone since the listing (or a link to nothing),
  which is then embedded afresh and, unreadable, skipped and counted as any other."""
  sizes, mtimes = np.full(len(paths), -1, np.int64), np.full(len(paths), -1, np.int64)
  for i, p in enumerate(paths):
    try:
      stat = os.stat(os.path.join(root, p))
    except FileNotFoundError:
      continue
    sizes[i], mtimes[i] = stat.st_size, stat.st_mtime_ns
  return sizes, mtimes


def _reset_partial(folder, stamp):
  """Makes folder/partial the chunks of fingerprint `stamp`: those an interrupted run of
  another fingerprint kept are removed."""
  partial = os.path.join(folder, 'partial')
  meta = os.path.join(partial, 'fingerprint.json')
  if os.path.isdir(partial) and files.read_text(meta) != stamp:
    shutil.rmtree(partial)
  os.makedirs(partial, exist_ok=True)
  files.write_atomic(meta, stamp)


def _partial(folder):
  """(the chunks kept in folder/partial (Entries, PCA or None))."""
  partial = os.path.join(folder, 'partial')
  chunks, fitted = [], None
  for name in sorted(os.listdir(partial)):
    path = os.path.join(partial, name)
    if name.startswith('chunk-') and name.endswith('.npz'):
      with np.load(path) as z:
        chunks.append(Entries(*[z[f.name] for f in dataclasses.fields(Entries)]))
    elif name == 'lbp_pca.npz':
      with np.load(path) as z:
        fitted = _pca_of({k: z[k] for k in z.files})
  return chunks, fitted


def _sync(name):
  """Waits for every process of the job (a no-op alone)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def build(config, model, workdir, listing, folder):
  """Builds or updates the index of the collection.Listing `listing` in `folder` (module
  docstring); returns (index, counts) with counts embedded / reused / dropped / unreadable.

  In a job of several processes (launch.local, SLURM, a TPU pod; `folder` on a disk they
  share) process 0 fits the SRS-LBP PCA, each process embeds its slice of the images still
  to embed into folder/partial, and process 0 merges them into index.npz."""
  root = listing.root
  collection.say_left_out(listing)
  settings, chosen_on = chosen_settings(config, workdir, model.step)
  console.say(f'Settings chosen on {chosen_on}: ' +
              ', '.join(f'{k} {v}' for k, v in settings.items()))
  if settings['rerank_k']:
    console.say(f'(SGR re-ranking, k={settings["rerank_k"]}, is not applied: it rebuilds every '
                "image's neighbourhood from all pairs of the collection)")
  workdir_lock.acquire(folder)  # process 0 holds it for the job
  try:
    return _build_locked(config, model, root, folder, listing, settings, chosen_on)
  finally:
    workdir_lock.release(folder)


def _reusable(old, chunks, listing, sizes, mtimes):
  """(Entries known from the index and the chunks, {listing row: its row there}) of the
  images whose path, size and time are unchanged."""
  known = Entries.concat(([old.entries] if old else []) + chunks) if (old or chunks) else None
  where = {}
  if known is not None:  # later chunks win: a file changed since the last index
    where = {p: r for r, p in enumerate(known.paths.tolist())}
  reuse = {}
  for i, p in enumerate(listing.paths):
    r = where.get(p)
    if r is not None and known.sizes[r] == sizes[i] and known.mtimes[r] == mtimes[i]:
      reuse[i] = r
  return known, reuse


def _build_locked(config, model, root, folder, listing, settings, chosen_on):
  local_model = inference.process_local(model)  # a collective: every process, once
  digest = checkpoint_digest(local_model)
  stamp = fingerprint(config, model.step, digest, settings)
  path = os.path.join(folder, 'index.npz')
  process, processes = jax.process_index(), jax.process_count()
  try:
    old = load(path) if os.path.exists(path) else None
  except Unreadable as e:  # what the search says to rebuild with launch.index
    console.say(f'{path}: {e.why}: rebuilding it whole')
    old = None
  if old is not None and old.header['fingerprint'] != stamp:
    console.say(f'{path} was built with checkpoint step {old.header["step"]} and other '
                'settings or config: rebuilding it whole')
    old = None
  if process == 0:
    _reset_partial(folder, stamp)
  _sync('index: partial')
  partial = os.path.join(folder, 'partial')
  chunks, fitted = _partial(folder)
  sizes, mtimes = _stat(root, listing.paths)
  _, reuse = _reusable(old, chunks, listing, sizes, mtimes)
  todo = [i for i in range(len(listing.paths)) if i not in reuse]

  fuse = settings['fusion_weight'] > 0
  lbp_pca = (old.lbp_pca if old else fitted) if fuse else None
  sampled = {}  # the PCA sample's patches and features, not extracted twice
  if fuse and lbp_pca is None:
    if process == 0:  # fitted once, before any process embeds with it
      lbp_pca, sampled = lbp_sample_pca(
          config, [os.path.join(root, p) for p in listing.paths], config.seed)
      _save_npz(os.path.join(partial, 'lbp_pca.npz'), _pca_arrays(lbp_pca))
    _sync('index: SRS-LBP PCA')
    lbp_pca = _partial(folder)[1]

  # Each process its slice of the sorted images still to embed, on its own devices.
  mine = np.array_split(np.array(todo, np.int64), processes)[process].tolist()
  # Patches are drawn seeded by the file's name (retrieval/features/patches.py), as for a query.
  jobs = [(os.path.join(root, listing.paths[i]), os.path.basename(listing.paths[i]))
          for i in mine]
  numbers = itertools.count(len(chunks))

  def on_chunk(rows, entries, messages):
    for m in messages:
      console.say(f'Skipping {m}')
    listed = np.array([mine[r] for r in rows], np.int64)
    entries.paths = np.array([listing.paths[i] for i in listed], str)
    entries.sizes, entries.mtimes = sizes[listed], mtimes[listed]
    _save_npz(os.path.join(partial, f'chunk-{next(numbers):06d}-{process:05d}.npz'),
              entries.arrays())

  if jobs:
    with errors.on_ctrl_c(f'Interrupted (Ctrl-C) while indexing {root}: the images embedded so '
                          f'far are kept in {partial}; rerun the same command to go on.'), \
        console.Progress(len(jobs), f'embedding {len(jobs):,} images', unit='image') as progress:
      embed(config, local_model, settings, lbp_pca, jobs, on_chunk, progress, sampled)
  _sync('index: embedded')

  # Every image embedded by any process is now in a chunk: merge what is reusable.
  known, merged = _reusable(old, _partial(folder)[0], listing, sizes, mtimes)
  if not merged:
    raise errors.UserError(f'{root}: none of its {len(listing.paths):,} images could be read')
  rows = np.array(sorted(merged), np.int64)
  entries = known.take(np.array([merged[i] for i in rows.tolist()], np.int64))
  header = dict(layout=LAYOUT, step=model.step, checkpoint=digest,
                settings=settings, chosen_on=chosen_on,
                fingerprint=stamp, config=config.to_json_best_effort(), root=os.path.abspath(root))
  index = Index(header, entries, lbp_pca)
  if process == 0:
    save(path, index)
    shutil.rmtree(partial)
  _sync('index: saved')
  before = set(old.entries.paths.tolist()) if old else set()
  counts = dict(embedded=len(merged) - len(reuse), reused=len(reuse),
                unreadable=len(todo) - (len(merged) - len(reuse)),
                dropped=len(before - set(listing.paths)))
  return index, counts
