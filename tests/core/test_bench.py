"""bench/: the runner's contract and its table in docs/benchmarks.md, the worker protocol, the metric references.

The benchmarks themselves take minutes (`python -m bench.run --quick`); these check the
machinery on tiny sizes, in seconds.
"""
import json
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
                          ratio=20.0, target='>= 5x', passed=True, repeats=3, note='a | b')]
""")


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


def test_table_goes_between_the_markers(tmp_path):
  row = common.record('fake speed', 12345.6, 'images/s', 'ref', 1000.0, ratio=12.3456,
                      target='>= 5x', passed=True, repeats=3, note='a | b')
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
  assert ('| fake speed | 12,346 images/s | ref: 1,000 images/s | 12.3x | >= 5x | pass | a \\| b '
          '| 2026-01-02, 0123456, 2 cores cpu, jax 0 cpu |') in text
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


def test_retrieval_rows_through_workers():
  rows = metrics_speed.retrieval('tiny', repeats=1)  # asserts equal results itself
  assert [r['unit'] for r in rows] == ['s', 's', 'GB']
  assert all(r['value'] > 0 and r['reference_value'] > 0 for r in rows)
  json.dumps(rows)  # results.json must be able to hold them


def test_macro_recall_matches_sklearn_at_size():
  row = metrics_speed.macro_recall(repeats=1)  # asserts equal scores itself
  assert row['unit'] == 'ms' and row['ratio'] > 0


def test_interleaved_keeps_the_fastest_and_honours_timed():
  calls = []
  best = common.interleaved({
      'a': lambda: calls.append('a') or 'x',
      'b': lambda: calls.append('b') or common.Timed(0.5, 'y'),
  }, repeats=2)
  assert calls == ['a', 'b', 'a', 'b']
  assert best['b'] == (0.5, 'y') and best['a'][1] == 'x' and best['a'][0] < 0.5
  assert np.isfinite(best['a'][0])
