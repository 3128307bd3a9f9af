"""eval/report.html: per-query retrieval figures against the evaluator, and both tasks' pages
rendered by headless Chromium."""
import os
import re

import numpy as np
import pytest

from bengrapheme import report
from conftest import needs_chromium, screenshot_in_chromium
from retrieval.fragments import metrics, report as retrieval_report

HEADINGS = {
    'grapheme': ['Training curves', 'Seen vs unseen graphemes', 'Per-component recall',
                 'Most confused class pairs', 'Misclassified samples'],
    'fragment': ['Training curves', 'Encoder vs SRS-LBP', 'Precision-recall curve',
                 'AP against fragment size', 'Queries and their top results'],
}


def reference_queries(x, labels, metric):
  """Per-query AP and interpolated PR by sorting each row, the query losing every tie."""
  d = metrics.distance_matrix(x, metric=metric)
  ap, pr = np.full(len(x), np.nan), []
  for q in range(len(x)):
    others = np.delete(np.arange(len(x)), q)
    relevant = labels[others] == labels[q]
    hits = relevant[np.lexsort((relevant, d[q, others]))]  # at equal distance, relevant last
    if hits.any():
      ranks = np.flatnonzero(hits) + 1
      precision = np.arange(1, len(ranks) + 1) / ranks
      recall = np.arange(1, len(ranks) + 1) / len(ranks)
      ap[q] = precision.mean()
      pr.append([precision[recall >= level - 1e-9].max() for level in
                 retrieval_report.RECALL_LEVELS])
  return ap, np.mean(pr, axis=0)


@pytest.mark.parametrize('metric', ['euclidean', 'cityblock'])
def test_per_query_figures_match_a_sorting_reference(metric):
  rng = np.random.default_rng(0)
  # Coarse values make many exact ties; writer 9 has a single item (a query without relevant).
  x = rng.integers(0, 4, (70, 3)).astype(np.float32)
  writer = np.append(rng.integers(0, 9, 69), 9)
  page = writer * 2 + rng.integers(0, 2, 70)
  # Blocks of 16: the ranks of several blocks are put back in item order.
  expected = metrics.retrieval_metrics(x, {'writer': writer, 'page': page}, metric=metric,
                                       per_query=True, block_size=16)
  ap = {name: expected[name]['ap'] for name in ('writer', 'page')}
  pr = {name: retrieval_report.pr_curve(expected[name]['ranks']) for name in ('writer', 'page')}
  for name, labels in (('writer', writer), ('page', page)):
    reference_ap, reference_pr = reference_queries(x, labels, metric)
    # The kernel sums each query's precisions in float32 on the device.
    np.testing.assert_allclose(ap[name], reference_ap, rtol=1e-6)
    np.testing.assert_allclose(pr[name], reference_pr, rtol=1e-12)
    assert np.nanmean(ap[name]) == pytest.approx(expected[name]['map'], abs=1e-6)
  top = retrieval_report.nearest(x, np.arange(len(x)), metric)
  d = metrics.distance_matrix(x, metric=metric)
  np.fill_diagonal(d, np.inf)
  np.testing.assert_array_equal(np.take_along_axis(d, top, 1),
                                np.sort(d, 1)[:, :top.shape[1]])


def test_text_is_escaped_and_markup_is_not():
  cell = report.table(['a<b'], [['<script>', report.Html('<b>bold</b>'), 0.5, 1200]])
  assert '&lt;script&gt;' in cell and '<b>bold</b>' in cell and 'a&lt;b' in cell
  assert '0.500' in cell and '1,200' in cell
  chart = report.xy_chart(lines={'nan': ([1, 2], [np.nan, np.nan])}, title='t', x_label='x',
                          y_label='y')
  assert 'no data' in chart


def report_path(task, request):
  return os.path.join(request.getfixturevalue(f'{task}_evaluated'), 'eval', 'report.html')


@pytest.mark.slow
@pytest.mark.parametrize('task', ['grapheme', 'fragment'])
def test_report_has_every_section_and_is_self_contained(task, request):
  """Checked without a browser, so that a machine without Chromium still checks it."""
  with open(report_path(task, request), encoding='utf-8') as f:
    page = f.read()
  headings = re.findall(r'<h[23]>(.*?)</h[23]>', page)
  for heading in HEADINGS[task]:
    assert heading in headings
  assert not re.search(r'<(script|link)\b|src="(?!data:)', page)  # no outside file needed


@needs_chromium
@pytest.mark.parametrize('task', ['grapheme', 'fragment'])
def test_report_renders_in_headless_chromium(task, request, tmp_path):
  image = screenshot_in_chromium(report_path(task, request), tmp_path, (1200, 3000))
  colours = np.unique(image.reshape(-1, 3)[::7], axis=0)
  assert len(colours) > 100  # text, charts and images drawn, not a blank page
