"""bench/: the runner's contract and its table in docs/benchmarks.md, the worker protocol, the metric references.

The benchmarks themselves take minutes (`python -m bench.run --quick`); these check the
machinery on tiny sizes, in seconds.
"""
import json
import os
import textwrap

import numpy as np
import pytest

from bench import common, metrics_speed, run
from retrieval.fragments import metrics

FAKE = textwrap.dedent("""
  from bench import common

  def run(quick):
    if not quick:
      raise RuntimeError('only quick here')
    return [common.record('fake speed', 2000.0, 'images/s', 'fake reference', 100.0,
                          ratio=20.0, target='>= 5x', passed=True, note='a | b')]
""")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
  """The machinery's checks time nothing: they do not wait for a quiet machine."""
  monkeypatch.setattr(common, 'QUIET_SECONDS', 0)


def test_turns_wait_for_the_load_of_the_setting_up_to_fall(monkeypatch):
  """The load average just after compiling counts the bench's own work: a row waits for it
  to fall to the cores before its turns, and is busy only if it does not in time."""
  falling = iter([3.5, 2.9, 2.1, 1.4, 1.2])
  monkeypatch.setattr(common, 'load_average', lambda: next(falling))
  monkeypatch.setattr(common.time, 'sleep', lambda s: None)
  assert common.quiet_load_average(cores=2, timeout=60) == 1.4
  monkeypatch.setattr(common, 'load_average', lambda: 3.5)
  assert common.quiet_load_average(cores=2, timeout=0) == 3.5
  assert common.verdict([True] * 5, 3.5, cores=2) == 'busy'


@pytest.fixture
def fake_modules(tmp_path, monkeypatch):
  package = tmp_path / 'fakebench'
  package.mkdir()
  (package / '__init__.py').write_text('')
  (package / 'ok.py').write_text(FAKE)
  (package / 'broken.py').write_text('def run(quick):\n  return [{"name": "no value"}]\n')
  monkeypatch.setenv('PYTHONPATH', str(tmp_path))


def test_module_rows_and_errors_come_back(fake_modules):
  rows, error = run.run_module('fakebench.ok', quick=True)
  assert error is None
  assert rows[0]['name'] == 'fake speed' and rows[0]['ratio'] == 20.0
  rows, error = run.run_module('fakebench.ok', quick=False)
  assert rows == [] and 'only quick here' in error
  rows, error = run.run_module('fakebench.broken', quick=True)
  assert rows == [] and 'lacks' in error


def turns(*each, load=(0.5, 0.7)):
  """Fake timings: each turn's seconds of 'new' and 'ref'."""
  return common.Turns({}, [dict(new=new, ref=ref) for new, ref in each], load)


def fake_row(*each, load=(0.5, 0.7), target='>= 5x', threshold=5.0):
  """A timed row of images/s (100 images a turn) against a reference."""
  return common.timed_record(
      'fake speed', 'images/s', 'ref', turns(*each, load=load),
      lambda t: (100 / t['new'], 100 / t['ref'], t['ref'] / t['new']), target=target,
      meets=None if target is None else lambda value, ratio: ratio >= threshold, note='a | b')


def test_a_timed_row_holds_every_turn_and_the_load():
  row = fake_row((1, 6), (2, 6), (1, 12), (1, 7), (0.5, 4), load=(0.5, 1.5))
  assert row['repeats'] == [6, 3, 12, 7, 8]
  assert (row['median'], row['min'], row['max']) == (7, 3, 12)
  assert row['ratio'] == 7 and row['value'] == 100 and row['reference_value'] == 100 / 6
  assert row['load_average'] == [0.5, 1.5]
  # Without a reference, the turns' values make the spread.
  row = common.timed_record('round', 'ms', None, turns((0.1, 0), (0.3, 0), (0.2, 0)),
                            lambda t: (t['new'] * 1e3, None, None), target='<= 250 ms',
                            meets=lambda value, ratio: value <= 250)
  assert row['repeats'] == pytest.approx([100, 300, 200]) and row['ratio'] is None
  assert row['value'] == pytest.approx(200) and row['verdict'] == 'within noise'


def test_a_verdict_needs_every_turn_to_agree():
  assert fake_row((1, 6), (1, 5), (1, 9))['verdict'] == 'pass'  # the worst turn clears 5x
  assert fake_row((1, 4), (1, 2), (1, 4.9))['verdict'] == 'miss'  # not even the best does
  # One lucky draw (the ratio of the fastest of each side would be 6x) is no pass.
  assert fake_row((1, 4), (1, 6), (1, 4))['verdict'] == 'within noise'
  assert fake_row((2, 6), (1, 9))['verdict'] == 'within noise'
  # Loaded beyond the cores at the start: no verdict, whatever the turns say.
  cores = os.cpu_count()
  assert fake_row((1, 9), load=(cores + 0.1, 0))['verdict'] == 'busy'
  assert fake_row((1, 9), load=(cores, cores + 3))['verdict'] == 'pass'
  assert fake_row((1, 9), target=None, threshold=None)['verdict'] is None
  with pytest.raises(ValueError, match="'fake speed': a target needs meets"):
    common.timed_record('fake speed', 's', None, turns((1, 1)), lambda t: (1, None, None),
                        target='<= 2 s')


def test_the_readme_shows_every_row_with_a_target():
  machine = dict(cpu_count=2, cpu='cpu', jax='0', jax_backend='cpu, 1 device: cpu')
  rows = [fake_row((1, 6), (1, 4.5), (1, 8)),
          common.timed_record('jit compile, x', 's', None, turns((9, 0), (12, 0), (11, 0)),
                              lambda t: (t['new'], None, None), target='<= 10 s',
                              meets=lambda value, ratio: value <= 10),
          common.record('bytes', 3.0, 'bytes', None, None, ratio=None)]
  results = dict(results=[dict(r, module=m, date='2026-01-02T03:04:05+00:00', commit='0' * 40,
                               machine=machine) for r, m in zip(rows, 'xyx')],
                 modules=dict(x=dict(quick=False), y=dict(quick=True)))
  assert run.summary(results).splitlines()[2:] == [
      '| fake speed | 100 images/s | ref: 16.7 images/s | 6.00x | 4.50-8.00x, 3 turns | >= 5x '
      '| within noise |',
      '| jit compile, x (--quick run) | 11.0 s |  |  | 9.00-12.0 s, 3 turns | <= 10 s | '
      'within noise |']
  assert '**--quick run (reduced sizes, a smoke test; not the figures to quote) of bench/y.py.**' \
      in run.table(results)


def test_table_goes_between_the_markers(tmp_path):
  row = fake_row((1, 12), (1, 13), (1, 12.3456), (1, 12.3), (1, 13), load=(1.25, 1.5))
  machine = dict(cpu_count=2, cpu='cpu', jax='0', jax_backend='cpu, 1 device: cpu')
  results = dict(results=[dict(row, module='x', date='2026-01-02T03:04:05+00:00',
                               commit='0123456789abcdef', machine=machine)],
                 modules=dict(x=dict(quick=False, error=None),
                              y=dict(quick=False, error='exit code 1: Boom\nValueError: bad')))
  page = tmp_path / 'benchmarks.md'
  page.write_text(f'# t\n\n{run.BEGIN}\nold\n{run.END}\nafter\n')
  run.write_table(page, run.table(results))
  text = page.read_text()
  assert text.startswith('# t\n\n' + run.BEGIN) and text.endswith(run.END + '\nafter\n')
  assert 'old' not in text
  assert ('| fake speed | 100 images/s | ref: 8.10 images/s | 12.3x | 12.0-13.0x, 5 turns | '
          '>= 5x | pass | 1.2 -> 1.5 | a \\| b | 2026-01-02, 0123456, 2 cores cpu, jax 0 cpu |'
          ) in text
  assert '`bench/y.py` failed: ValueError: bad' in text
  run.write_table(page, 'new')  # rewriting replaces, never stacks
  assert page.read_text() == f'# t\n\n{run.BEGIN}\nnew\n{run.END}\nafter\n'


def test_the_table_has_a_page(tmp_path):
  with open(run.PAGE) as f:  # docs/benchmarks.md, which `python -m bench.run` rewrites
    text = f.read()
  assert text.index(run.BEGIN) < text.index(run.END)
  page = tmp_path / 'no-markers.md'
  page.write_text('# t\n')
  with pytest.raises(ValueError, match='no <!-- bench:begin --> ... <!-- bench:end --> section'):
    run.write_table(page, 'x')
  assert page.read_text() == '# t\n'


def test_numpy_evaluator_matches_retrieval_metrics():
  # Small integer embeddings: many exact ties, which both must break against the query.
  x, writer, page = metrics_speed.retrieval_data(n=400, writers=25, pages=60, dim=8, seed=1)
  want = metrics_speed.numpy_evaluator(x, writer, page, block=64)
  got = metrics.retrieval_metrics(x, {'writer': writer, 'page': page})
  for labeling in ('writer', 'page'):
    assert got[labeling]['num_queries'] == want[labeling]['num_queries']
    for key in ('map', 'top1', 'pr10', 'pr100'):
      assert got[labeling][key] == pytest.approx(want[labeling][key], abs=1e-6)


@pytest.mark.slow
def test_retrieval_rows_through_workers():
  rows = metrics_speed.retrieval('tiny', repeats=1)  # asserts equal results itself
  assert [r['unit'] for r in rows] == ['s', 's', 'GB']
  assert all(r['value'] > 0 and r['reference_value'] > 0 for r in rows)
  json.dumps(rows)  # results.json must be able to hold them


def test_macro_recall_matches_sklearn_at_size():
  row = metrics_speed.macro_recall(repeats=1)  # asserts equal scores itself
  assert row['unit'] == 'ms' and row['ratio'] > 0


def test_interleaved_takes_turns_and_keeps_each():
  calls, seconds = [], iter([0.5, 0.25, 0.75])
  turns = common.interleaved({
      'a': lambda: calls.append('a') or 'x',
      'b': lambda: calls.append('b') or common.Timed(next(seconds), 'y'),
  }, repeats=3)
  assert calls == ['a', 'b', 'a', 'b', 'a', 'b']
  assert [t['b'] for t in turns.each] == [0.5, 0.25, 0.75]
  assert turns['b'] == (0.25, 'y') and turns['a'][1] == 'x' and turns['a'][0] < 0.25
  assert all(np.isfinite(t['a']) for t in turns.each) and len(turns.load) == 2


def test_a_run_keeps_the_rows_of_the_modules_it_leaves_out():
  """A full run replaces its modules' rows and keeps real_sizes' (run only on request)."""
  previous = dict(results=[dict(module='train_step', name='a'), dict(module='real_sizes',
                                                                      name='b')],
                  modules=dict(train_step={}, real_sizes={}))
  full = run.kept(previous, list(run.MODULES))
  assert full == dict(results=[dict(module='real_sizes', name='b')],
                      modules=dict(real_sizes={}))
  only = run.kept(previous, ['real_sizes'])
  assert only == dict(results=[dict(module='train_step', name='a')],
                      modules=dict(train_step={}))
