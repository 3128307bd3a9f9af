"""Real sizes: the Bengali.AI and HisFrag20 jobs at the sizes users run them, on this machine.

  python -m bench.run --only real_sizes     # ~1 h on 2 cores, ~45 GB of disk
  python -m bench.real_sizes --quick        # 1/50 of the sizes, a smoke run

Not in a plain `python -m bench.run`: it writes and reads ~40 GB. The data is kept under
$BENCH_REAL_SIZES (default /tmp/bengrapheme-real-sizes) for the next run.

Every job runs as its own process (the CLI a user runs, or a few lines calling the same
function), and `measure` samples its memory every 50 ms from /proc: the peak resident set
(RSS), and its anonymous part (heap: what cannot be dropped under memory pressure, unlike
the page cache of memory-mapped files, which RSS also counts). Disk is the bytes a job
leaves behind (du).

Bengali.AI, a full-size Kaggle folder (bench/full_size_data.py: 200,840 train and 200,840
test images in the real layout):
- prepare: the train split converted once to the training layout, against the same at a
  tenth of the size (ratio: how close to linear it scales).
- training input: the trainer's grain stream (configs/grapheme.py:kaggle batch and threads)
  over the prepared full train split, against the same over the tenth.
- predict, streamed from the parquet files (config.predict.read='stream', the default)
  against predicting from a prepared copy ('prepared': conversion included), both at full
  size; and its peak memory at full size against a tenth, which shows whether memory grows
  with the test set. The model is configs/grapheme.py:test with batch 256, trained 2 steps:
  the figures are the framework's reading and bookkeeping, not a network's compute.

HisFrag20 (fragments copied from synthetic ones under HisFrag20 names: ~17 fragments a
writer, ~7 a page): launch.evaluate of configs/fragments.py:demo at two test sizes, and the
parts that grow with N x N (the distance matrix, its scores and its export) measured at the
real 20,019 from random embeddings. Times at 20,019 for the whole evaluation are
extrapolated from the two sizes (a + b N + c N^2 is not determined by two points, so: the
per-fragment part linear from the two sizes, the N x N part measured).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from bench import common
from bengrapheme import files

DATA_ROOT = pathlib.Path(os.environ.get('BENCH_REAL_SIZES', '/tmp/bengrapheme-real-sizes'))
KAGGLE_IMAGES = 200_840
HISFRAG_TEST, HISFRAG_TRAIN = 20_019, 101_706
GRAPHEME = 'configs/grapheme.py:test'
FRAGMENTS = 'configs/fragments.py:demo'


def log(*args):
  print(*args, file=sys.stderr, flush=True)


def measure(args, *, env=None, capture=False):
  """Runs `args` (a command) to completion; returns dict(seconds, peak_rss, peak_anon) with
  the memory summed over the process and its children, sampled every 50 ms, and with
  `capture` the JSON value its last output line holds as 'result'."""
  full_env = dict(os.environ, PYTHONPATH=common.ROOT, JAX_PLATFORMS='cpu', **(env or {}))
  with tempfile.TemporaryFile('w+') as out:
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=common.ROOT, env=full_env, stdout=out,
                            stderr=subprocess.STDOUT, text=True)
    peak_rss = peak_anon = 0
    while proc.poll() is None:
      rss, anon = _tree_memory(proc.pid)
      peak_rss, peak_anon = max(peak_rss, rss), max(peak_anon, anon)
      time.sleep(0.05)
    seconds = time.perf_counter() - start
    out.seek(0)
    output = out.read()
  if proc.returncode:
    raise RuntimeError(f'{" ".join(map(str, args))} exited {proc.returncode}:\n'
                       f'{output[-4000:]}')
  m = dict(seconds=seconds, peak_rss=peak_rss, peak_anon=peak_anon)
  if capture:
    m['result'] = json.loads(output.strip().splitlines()[-1])
  return m


def _tree_memory(pid):
  """(RSS, anonymous RSS) in bytes of pid and its descendants."""
  rss = anon = 0
  pending = [pid]
  while pending:
    p = pending.pop()
    try:
      with open(f'/proc/{p}/status') as f:
        for line in f:
          if line.startswith('VmRSS:'):
            rss += int(line.split()[1]) * 1024
          elif line.startswith('RssAnon:'):
            anon += int(line.split()[1]) * 1024
      with open(f'/proc/{p}/task/{p}/children') as f:
        pending += [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
      continue
  return rss, anon


def disk(path):
  return sum(f.stat().st_size for f in pathlib.Path(path).rglob('*') if f.is_file())


def python(*lines):
  return [sys.executable, '-c', '\n'.join(lines)]


def module(name, *args):
  return [sys.executable, '-m', name, *map(str, args)]


GB = 1e9


# ---------------------------------------------------------------- Bengali.AI


def bengali_data(scale):
  """(full folder, tenth folder): written once, kept under DATA_ROOT."""
  from bench import full_size_data
  folders = []
  for name, train, test in (('full', KAGGLE_IMAGES, KAGGLE_IMAGES),
                            ('tenth', KAGGLE_IMAGES // 10, KAGGLE_IMAGES // 10)):
    folder = DATA_ROOT / f'bengali-{name}-{scale}'
    if not (folder / 'test.csv').exists():
      log(f'writing {folder} ...')
      seconds = full_size_data.write(str(folder), train // scale, test // scale, log=log)
      log(f'  {seconds:.0f} s')
    folders.append(folder)
  return folders


def bengali(scale, work):
  full, tenth = bengali_data(scale)
  n_full = KAGGLE_IMAGES // scale
  workdir = work / 'grapheme-workdir'
  common_flags = [f'--config={GRAPHEME}', '--workdir', workdir, '--config.eval.batch_size=256']
  log('training the test config 2 steps on the tenth ...')
  measure(module('launch.train', *common_flags, '--data', tenth, '--config.train.steps=2',
                 f'--config.data.cache_dir={work / "train-cache"}'))
  rows, figures = [], {}

  # prepare, and the training input stream over what it wrote
  for name, folder in (('full', full), ('tenth', tenth)):
    cache = work / f'prepared-{name}'
    log(f'prepare train ({name}) ...')
    m = measure(python('import sys', 'from bengrapheme.grapheme import prepare',
                       f'print(prepare.prepare({str(folder)!r}, "train", {str(cache)!r}))'))
    m['disk'] = disk(cache)
    figures[f'prepare_{name}'] = m
    log(f'  {m}')
    log(f'training input stream ({name}) ...')
    figures[f'stream_{name}'] = measure(python(
        'import json, sys, time',
        'from bengrapheme import input as input_lib',
        'from bengrapheme.grapheme import prepare',
        'from configs import grapheme',
        'c = grapheme.get_config("kaggle")',
        f'src = prepare.GraphemeSource(prepare.prepare({str(folder)!r}, "train", '
        f'{str(cache)!r}))',
        'it = iter(input_lib.train_dataset(src, batch_size=c.train.batch_size, seed=0, '
        'process_index=0, process_count=1, num_threads=c.input.num_threads))',
        'for _ in range(2 * c.input.num_threads): next(it)',
        'n = min(len(src), 100_000) // c.train.batch_size',
        'start = time.perf_counter()',
        'for _ in range(n): next(it)',
        'print(json.dumps(n * c.train.batch_size / (time.perf_counter() - start)))',
        'sys.stdout.flush()', 'import os; os._exit(0)'), capture=True)
    log(f'  {figures[f"stream_{name}"]}')
  p_full, p_tenth = figures['prepare_full'], figures['prepare_tenth']
  mb = lambda n: n * 32_332 / 1e6
  n_tenth = KAGGLE_IMAGES // 10 // scale
  rows.append(common.record(
      f'prepare: train split, {n_full:,} images (full size)', mb(n_full) / p_full['seconds'],
      'MB/s', f'the same at {n_tenth:,} images', mb(n_tenth) / p_tenth['seconds'],
      ratio=(mb(n_full) / p_full['seconds']) / (mb(n_tenth) / p_tenth['seconds']),
      note=f"{p_full['seconds']:.0f} s, peak RSS {p_full['peak_rss'] / GB:.2f} GB "
           f"(anonymous {p_full['peak_anon'] / GB:.2f}), disk {p_full['disk'] / GB:.2f} GB; "
           f"at the tenth {p_tenth['seconds']:.0f} s, peak RSS "
           f"{p_tenth['peak_rss'] / GB:.2f} GB (anonymous {p_tenth['peak_anon'] / GB:.2f})"))
  s_full, s_tenth = figures['stream_full']['result'], figures['stream_tenth']['result']
  rows.append(common.record(
      f'training input: grain batches of 256 over the prepared {n_full:,}', s_full,
      'images/s', f'the same over {n_tenth:,}', s_tenth, ratio=s_full / s_tenth,
      note=f"configs/grapheme.py:kaggle threads; peak RSS "
           f"{figures['stream_full']['peak_rss'] / GB:.2f} GB (anonymous "
           f"{figures['stream_full']['peak_anon'] / GB:.2f}: the rest is the memory map's "
           'page cache)'))

  # predict: streamed (both sizes, and a bounded window) and from a prepared copy
  runs = {'stream_full': (full, []), 'stream_tenth': (tenth, []),
          'window_full': (full, ['--config.predict.window_rows=8192']),
          'prepared_full': (full, ['--config.predict.read=prepared'])}
  for name, (folder, extra) in runs.items():
    cache = work / f'predict-cache-{name}'
    log(f'predict {name} ...')
    m = measure(module('launch.predict', *common_flags, '--data', folder,
                       f'--config.data.cache_dir={cache}', *extra))
    m['disk'] = disk(cache) if cache.exists() else 0
    figures[f'predict_{name}'] = m
    log(f'  {m}')
    _check_submission(folder, workdir / 'submission.csv')
  st, pr, tn, wi = (figures[f'predict_{k}'] for k in
                    ('stream_full', 'prepared_full', 'stream_tenth', 'window_full'))
  rows.append(common.record(
      f'predict: {n_full:,} test images streamed from the parquet files', st['seconds'], 's',
      'from a prepared copy (conversion included)', pr['seconds'],
      ratio=pr['seconds'] / st['seconds'],
      note=f"streamed: peak RSS {st['peak_rss'] / GB:.2f} GB (anonymous "
           f"{st['peak_anon'] / GB:.2f}), no disk; prepared: peak RSS "
           f"{pr['peak_rss'] / GB:.2f} GB (anonymous {pr['peak_anon'] / GB:.2f}), disk "
           f"{pr['disk'] / GB:.2f} GB; configs/grapheme.py:test model, batch 256"))
  rows.append(common.record(
      f'predict peak memory, {n_full:,} test images (streamed, a whole file at a time)',
      st['peak_rss'] / GB, 'GB', f'the same at {n_tenth:,}', tn['peak_rss'] / GB,
      ratio=tn['peak_rss'] / st['peak_rss'], target='<= 13 GB',
      passed=st['peak_rss'] <= 13 * GB,
      note=f"one file's pixels: {n_full // 4:,} x 32,332 B = {n_full // 4 * 32_332 / GB:.2f} "
           f"GB; with --config.predict.window_rows=8192: peak RSS {wi['peak_rss'] / GB:.2f} "
           f"GB in {wi['seconds']:.0f} s (each window decodes its one-row-group file again)"))
  return rows, figures


def _check_submission(folder, path):
  with open(folder / 'test.csv') as f:
    expected = [line.split(',', 1)[0] for line in f][1:]
  with open(path) as f:
    got = [line.split(',', 1)[0] for line in f][1:]
  if got != expected:
    raise AssertionError(f'{path}: rows differ from {folder / "test.csv"}')


# ---------------------------------------------------------------- HisFrag20


def fragment_folder(root, n_test, n_train):
  """HisFrag20-named copies of synthetic fragments: train/ and test/ under root."""
  if (root / 'test').is_dir():
    return root
  from retrieval.synthetic import synth
  pieces = root.parent / f'{root.name}-pieces'
  shutil.rmtree(pieces, ignore_errors=True)
  synth.write_dataset(str(pieces), 4, 4, 4, seed=0, workers=2)
  sources = sorted(pieces.glob('*/*.jpg'))
  # Not durable (no fsync of each of its thousands of links): scratch data for the bench.
  with files.atomic_dir(root, durable=False) as tmp:
    for split, n in (('test', n_test), ('train', n_train)):
      folder = tmp / split
      folder.mkdir()
      for i in range(n):
        # ~17 fragments a writer and ~7 a page, as in HisFrag20's test set.
        writer, page = i // 17, (i % 17) // 7
        os.link(sources[i % len(sources)],
                folder / f'{writer + 1}_{3 * writer + page + 1}_{i + 1}.jpg')
  shutil.rmtree(pieces)
  return root


def fragments(scale, work):
  sizes = (HISFRAG_TEST // 20 // scale, HISFRAG_TEST // 5 // scale)
  train = fragment_folder(DATA_ROOT / f'fragments-train-{scale}', 200, 1000)
  workdir = work / 'fragment-workdir'
  log('training the fragment demo config 2 steps ...')
  measure(module('launch.train', f'--config={FRAGMENTS}', '--data', train, '--workdir',
                 workdir, '--config.train.steps=2', '--config.evals.val.every=0',
                 '--config.evals.test.every=0'))
  figures = {}
  for n in sizes:
    data = fragment_folder(DATA_ROOT / f'fragments-{n}', n, 200)
    log(f'evaluate {n} fragments ...')
    eval_work = work / f'fragment-eval-{n}'
    shutil.copytree(workdir, eval_work)
    m = measure(module('launch.evaluate', f'--config={FRAGMENTS}', '--data', data,
                       '--workdir', eval_work))
    m['disk'] = disk(eval_work) - disk(workdir)
    figures[f'evaluate_{n}'] = m
    log(f'  {m}')
  n_full = HISFRAG_TEST // scale
  log(f'distance matrix of {n_full:,}: scores and export ...')
  out = work / 'matrix'
  m = measure(python(
      'import json, time, numpy as np',
      'from retrieval.fragments import distances_io, metrics',
      'from bengrapheme import files',
      f'n = {n_full}',
      'rng = np.random.default_rng(0)',
      'emb = rng.normal(size=(n, 64)).astype(np.float32)',
      'labels = {"writer": np.arange(n) // 17, "page": np.arange(n) // 7}',
      't = {}; s = time.perf_counter()',
      'd = metrics.distance_matrix(emb, metric="euclidean")',
      't["distances"] = time.perf_counter() - s; s = time.perf_counter()',
      'metrics.metrics_from_distances(d, labels)',
      't["scores"] = time.perf_counter() - s; s = time.perf_counter()',
      f'files.save_npy({str(out)!r} + ".npy", d)',
      't["npy"] = time.perf_counter() - s; s = time.perf_counter()',
      f'distances_io.write_distance_csv({str(out)!r} + ".csv", d, '
      '[f"{i}_{i}_{i}.jpg" for i in range(n)])',
      't["csv"] = time.perf_counter() - s',
      'print(json.dumps(t))'), capture=True)
  m['npy_bytes'] = os.path.getsize(f'{out}.npy')
  m['csv_bytes'] = os.path.getsize(f'{out}.csv')
  figures['matrix_full'] = m
  log(f'  {m}')
  small, large = (figures[f'evaluate_{n}'] for n in sizes)
  t = m['result']
  per_fragment = (large['seconds'] - small['seconds']) / (sizes[1] - sizes[0])
  estimate = large['seconds'] + per_fragment * (n_full - sizes[1]) + sum(t.values())
  rows = [common.record(
      f'fragments: launch.evaluate, {sizes[1]:,} test fragments', sizes[1] / large['seconds'],
      'fragments/s', f'the same at {sizes[0]:,}', sizes[0] / small['seconds'],
      ratio=(sizes[1] / large['seconds']) / (sizes[0] / small['seconds']),
      note=f"{large['seconds']:.0f} s, peak RSS {large['peak_rss'] / GB:.2f} GB, disk "
           f"{large['disk'] / GB:.2f} GB (cache, report, exports); extrapolated to "
           f"{n_full:,}: ~{estimate / 60:.0f} min (per fragment "
           f"{per_fragment * 1000:.0f} ms from the two sizes, plus the N x N part below)"),
      common.record(
          f'fragments: {n_full:,} x {n_full:,} distances exported as .npy', t['npy'], 's',
          'as the N x N CSV', t['csv'], ratio=t['csv'] / t['npy'],
          note=f".npy {m['npy_bytes'] / GB:.2f} GB, CSV {m['csv_bytes'] / GB:.2f} GB; "
               f"distances {t['distances']:.0f} s, writer+page scores {t['scores']:.0f} s; "
               f"peak RSS {m['peak_rss'] / GB:.2f} GB")]
  return rows, figures


def run(quick):
  scale = 50 if quick else 1
  DATA_ROOT.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=DATA_ROOT) as work:
    work = pathlib.Path(work)
    rows, figures = bengali(scale, work)
    more, fragment_figures = fragments(scale, work)
  figures.update(fragment_figures)
  (DATA_ROOT / f'figures-{scale}.json').write_text(json.dumps(figures, indent=1))
  return rows + more


if __name__ == '__main__':
  common.main(__doc__, run)
