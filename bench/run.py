"""Runs every benchmark; writes bench/results.json, the table in docs/benchmarks.md and, in the
README, every row that has a target.

  python -m bench.run                      # everything, full size (5 turns a row: tens of minutes)
  python -m bench.run --quick              # reduced sizes, a smoke run (5 turns a row too)
  python -m bench.run --only metrics_speed sharding
  python -m bench.run --only real_sizes   # full-size datasets, ~1 h (not run by default)

Each module runs in a fresh Python process (no jax state, compiled code or memory carries
over from one to the next); a module that fails is reported and the others still run. The
rows of the modules a run leaves out stay in results.json (with --only, every other module;
in a full run, real_sizes), so the table stays complete.

Contract for a bench module (bench/NAME.py, listed in MODULES):

  def run(quick: bool) -> list[dict]

  Each dict is one row of the table (bench.common.timed_record builds a timed one,
  bench.common.record an untimed one):
    name             str, unique across the bench, e.g. 'grapheme uint8 batches via grain'
    value            float, the measured figure, in `unit`
    unit             str, e.g. 'images/s', 'MB/s', 'ms', 's', 'GB'
    reference        str or None: what it is measured against, e.g. 'sklearn recall_score'
    reference_value  float or None, in the same unit
    ratio            float or None: how many times better than the reference; higher is
                     better whatever the unit (value / reference for rates, reference /
                     value for times)
    target           str or None, e.g. '>= 5x', '>= 5x and >= 10,000 images/s', '<= 2 GB'
    verdict          'pass', 'miss', 'within noise' (some turns clear the target, some do
                     not), 'busy' (the machine was loaded beyond its cores: no verdict), or
                     None when there is no target
    note             str (optional): sizes, settings, caveats, shown in the table
  and, in a timed row, the medians as value, reference_value and ratio, and
    repeats          [float]: each turn's ratio (its value where there is no ratio)
    median, min, max float: of repeats
    load_average     [before, after]: the 1-minute load average around the turns

  Rules: measure the reference in the same run on the same machine, in turns with the
  contender (A, B, A, B, ...: bench.common.interleaved / time_workers), at least
  bench.common.MIN_REPEATS turns, so that load from other processes hits both sides alike and
  the spread shows what it did. Assert that results the contender and reference should agree
  on are equal. --quick should take well under a minute per module, a full run a few
  minutes. Print progress to stderr, not stdout.
"""
import argparse
import collections
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

from bench import common
from bengrapheme import files

MODULES = ('input_pipeline', 'train_step', 'metrics_speed', 'sharding', 'fragment_features',
           'index_scale', 'checkpoint_save', 'serve_round', 'sweep_overhead')
# Run only when named with --only: ~1 h and ~45 GB of disk (bench/real_sizes.py).
ON_REQUEST = ('real_sizes',)
RESULTS = os.path.join(common.ROOT, 'bench', 'results.json')
# The page that holds the table, between BEGIN and END.
PAGE = os.path.join(common.ROOT, 'docs', 'benchmarks.md')
README = os.path.join(common.ROOT, 'README.md')
BEGIN, END = '<!-- bench:begin -->', '<!-- bench:end -->'
# The README's table (every row with a target) goes between SUMMARY_BEGIN and SUMMARY_END.
SUMMARY_BEGIN, SUMMARY_END = '<!-- bench-summary:begin -->', '<!-- bench-summary:end -->'
# A hung module must not hang the run; train_step, compiling each case 5 times, took over
# 30 min on 2 loaded cores.
MODULE_TIMEOUT = 60 * 60
ON_REQUEST_TIMEOUT = 150 * 60


def machine():
  """Where the figures come from. The accelerator is probed in a child process, so that this
  one never holds a device (jax would otherwise claim GPU memory the modules need)."""
  model = platform.processor()
  try:
    with open('/proc/cpuinfo') as f:
      model = next((line.split(':', 1)[1].strip() for line in f
                    if line.startswith('model name')), model)
  except OSError:
    pass
  probe = subprocess.run(
      [sys.executable, '-c', 'import jax; n = jax.device_count(); print(f"{jax.default_backend()}'
       ', {n} device{\'s\' * (n > 1)}: {jax.devices()[0].device_kind}")'],
      capture_output=True, text=True, timeout=300)
  backend = probe.stdout.strip() or f'unknown ({probe.stderr.strip()[-200:]})'
  return dict(cpu_count=os.cpu_count(), cpu=model, platform=platform.platform(),
              python=platform.python_version(), jax=_version('jax'),
              jaxlib=_version('jaxlib'), jax_backend=backend, flax=_version('flax'),
              numpy=_version('numpy'), torch=_version('torch'))


def commit():
  """The checkout's commit, '-dirty' when it has uncommitted changes (then no commit holds
  the code that was measured)."""
  git = lambda *a: subprocess.run(['git', *a], cwd=common.ROOT, capture_output=True,
                                  text=True).stdout.strip()
  return (git('rev-parse', 'HEAD') or 'unknown') + ('-dirty' if git('status', '--porcelain')
                                                    else '')


def _version(package):
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def run_module(name, quick):
  """Runs bench/NAME.py's run(quick) in a child process; returns (rows, error or None)."""
  with tempfile.TemporaryDirectory(prefix='bench-run-') as tmp:
    out = os.path.join(tmp, 'rows.json')
    command = [sys.executable, '-m', 'bench.run', '--child', name, '--out', out]
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [common.ROOT, env.get('PYTHONPATH')]))
    proc = subprocess.Popen(command + (['--quick'] if quick else []), cwd=common.ROOT,
                            env=env, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(ON_REQUEST_TIMEOUT if name in ON_REQUEST else MODULE_TIMEOUT,
                            proc.kill)
    timer.start()
    tail = collections.deque(maxlen=40)
    try:
      for line in proc.stderr:  # shown live, and the end kept for the error report
        sys.stderr.write(line)
        tail.append(line)
      code = proc.wait()
    finally:
      timer.cancel()
    if code != 0:
      return [], f'exit code {code}: ' + ''.join(tail)[-3000:]
    with open(out) as f:
      return json.load(f), None


def _child(name, quick, out):
  # A dotted name is a module from elsewhere (tests/core/test_bench.py runs a fake one).
  module = importlib.import_module(name if '.' in name else f'bench.{name}')
  rows = module.run(quick)
  required = ('name', 'value', 'unit', 'reference', 'reference_value', 'ratio', 'target',
              'verdict')
  for row in rows:
    missing = [k for k in required if k not in row]
    if missing:
      raise ValueError(f'bench.{name}: row {row.get("name")!r} lacks {missing}')
  with open(out, 'w') as f:
    json.dump(rows, f)


# ---------------------------------------------------------------- results and table


def _number(v):
  if v is None:
    return ''
  if abs(v) >= 100:
    return f'{v:,.0f}'
  return f'{v:#.3g}'.rstrip('.')  # 3 significant digits, trailing zeros kept: 4.00


def _quick_modules(results):
  return [name for name, entry in results['modules'].items() if entry['quick']]


def table(results):
  quick = _quick_modules(results)
  everything = len(quick) == len(results['modules'])
  lines = [
      f'`python -m bench.run{" --quick" if quick and everything else ""}` (modules measured apart keep their '
      'own rows: each row names its date, commit and machine; `bench/results.json` has the '
      'versions and every turn). Each ratio is against the reference measured in the same '
      'run, in turns with it: the median of the turns, then the lowest and highest turn; '
      'higher is better. A verdict needs every turn to agree (pass: the worst turn clears the '
      'target; miss: not even the best does; within noise: some do); busy: the 1-minute load '
      'average still exceeded the cores after up to 3 minutes of waiting before the turns '
      '(other processes shared them), no verdict.',
  ]
  if quick:
    lines.append('')
    lines.append('**--quick run: reduced sizes, a smoke test; not the figures to quote.**'
                 if everything else '**--quick run (reduced sizes, a smoke test; not the figures'
                 f' to quote) of {", ".join(f"bench/{n}.py" for n in quick)}.**')
  lines += ['', '| benchmark | result | reference | ratio | min-max | target | | load | notes '
            '| measured |', '|---|---|---|---|---|---|---|---|---|---|']
  for row in results['results']:
    lines.append(table_row(row, load(row), row.get('note', ''), measured(row)))
  for name, entry in results['modules'].items():
    if entry.get('error'):
      lines.append('')
      lines.append(f'`bench/{name}.py` failed: {entry["error"].strip().splitlines()[-1]}')
  return '\n'.join(lines)


def summary(results):
  """The README's table: every row that has a target, without the notes; a row of a --quick
  run says so."""
  quick = _quick_modules(results)
  lines = ['| benchmark | result | against, in the same run | ratio (median) | min-max | target '
           '| verdict |', '|---|---|---|---|---|---|---|']
  lines += [table_row(dict(row, name=row['name'] + ' (--quick run)')
                      if row.get('module') in quick else row)
            for row in results['results'] if row['target']]
  return '\n'.join(lines)


def table_row(row, *extra):
  """A row's markdown line: name, result, reference, ratio, spread, target, verdict, then
  `extra`."""
  reference = row['reference'] or ''
  if row['reference_value'] is not None:
    reference += f': {_number(row["reference_value"])} {row["unit"]}'
  ratio = '' if row['ratio'] is None else f'{_number(row["ratio"])}x'
  spread = ''
  if row.get('repeats'):
    unit = 'x' if row['ratio'] is not None else f' {row["unit"]}'
    spread = (f'{_number(row["min"])}-{_number(row["max"])}{unit}, '
              f'{len(row["repeats"])} turns')
  verdict = {'miss': '**miss**', None: ''}.get(row['verdict'], row['verdict'])
  cells = [row['name'], f'{_number(row["value"])} {row["unit"]}', reference, ratio, spread,
           row['target'] or '', verdict, *extra]
  return '| ' + ' | '.join(c.replace('|', '\\|') for c in cells) + ' |'


def load(row):
  """The 1-minute load average before and after the row's turns."""
  if 'load_average' not in row:
    return ''
  return '{:.1f} -> {:.1f}'.format(*row['load_average'])


def measured(row):
  m = row['machine']
  return (f'{row["date"][:10]}, {row["commit"][:7]}{"-dirty" * row["commit"].endswith("-dirty")}'
          f', {m["cpu_count"]} cores {m["cpu"]}, jax {m["jax"]} {m["jax_backend"].split(",")[0]}')


def write_table(path, text, markers=(BEGIN, END)):
  """Puts `text` between the two markers in the markdown file `path`."""
  with open(path) as f:
    page = f.read()
  start, stop = markers
  begin, end = page.find(start), page.find(stop)
  if begin < 0 or end < begin:
    raise ValueError(f'{path}: no {start} ... {stop} section to write the table into')
  page = page[:begin + len(start)] + '\n' + text + '\n' + page[end:]
  files.write_atomic(path, page)


def kept(previous, names):
  """The rows and module entries of `previous` (a results.json) that a run of the modules
  `names` leaves in place: every other module's, the on-request ones (real_sizes) included,
  which a full run does not measure."""
  return dict(results=[r for r in previous['results'] if r.get('module') not in names],
              modules={n: m for n, m in previous['modules'].items() if n not in names})


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='reduced sizes (a smoke run)')
  parser.add_argument('--only', nargs='+', choices=MODULES + ON_REQUEST, metavar='NAME',
                      help=f'run only these modules ({", ".join(MODULES + ON_REQUEST)})')
  parser.add_argument('--results', default=RESULTS, help='where to write results.json')
  parser.add_argument('--page', '--readme', dest='page', default=PAGE,
                      help="markdown page whose bench section to rewrite (default "
                      "docs/benchmarks.md; '' to leave it)")
  parser.add_argument('--child', help=argparse.SUPPRESS)
  parser.add_argument('--out', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return _child(args.child, args.quick, args.out)

  names = args.only or list(MODULES)
  results = dict(results=[], modules={})
  if os.path.exists(args.results):
    with open(args.results) as f:
      results = kept(json.load(f), names)
  started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
  info, code = machine(), commit()
  for name in names:
    print(f'== bench/{name}.py', file=sys.stderr, flush=True)
    start, load = time.perf_counter(), os.getloadavg()[0]
    if not os.path.exists(os.path.join(common.ROOT, 'bench', f'{name}.py')):
      rows, error = [], f'bench/{name}.py does not exist'
    else:
      rows, error = run_module(name, args.quick)
    for row in rows:  # every row says where, when and at which commit it was measured
      row.update(module=name, date=started, commit=code, machine=info)
    results['results'] = [r for r in results['results'] if r.get('module') != name] + rows
    # Load from other processes on the machine, before and after: the ratios are meant to
    # survive it, the absolute figures do not.
    results['modules'][name] = dict(date=started, quick=args.quick, error=error,
                                    seconds=round(time.perf_counter() - start, 1),
                                    load_average=[load, os.getloadavg()[0]], machine=info)
    for row in rows:
      ratio = '' if row['ratio'] is None else f'{row["ratio"]:.2f}x'
      spread = f' ({_number(row["min"])}-{_number(row["max"])})' if row.get('repeats') else ''
      print(f'  {row["name"]}: {_number(row["value"])} {row["unit"]} {ratio}{spread} '
            f'[{row["target"] or "no target"}: {row["verdict"] or "-"}]', file=sys.stderr,
            flush=True)
    if error:
      print(f'  FAILED: {error.strip().splitlines()[-1] if error.strip() else error}',
            file=sys.stderr, flush=True)
  # Rows in the order of MODULES, whatever order the runs came in.
  order = MODULES + ON_REQUEST
  results['results'].sort(key=lambda r: order.index(r['module'])
                           if r.get('module') in order else len(order))
  files.write_atomic(args.results, json.dumps(results, indent=1) + '\n')
  if args.page:
    write_table(args.page, table(results))
    write_table(README, summary(results), (SUMMARY_BEGIN, SUMMARY_END))
  print(f'wrote {args.results}' + (f' and {args.page}' if args.page else ''),
        file=sys.stderr)
  failed = [n for n in names if results['modules'][n]['error']]
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
