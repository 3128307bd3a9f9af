"""The fragment retrieval sections of report.html: encoder vs SRS-LBP, precision-recall
curves, AP against fragment size, and queries with their top results marked right or wrong.

Every figure comes from the one ranker, the evaluator's metrics kernel (retrieval/fragments/metrics.py):
each query's AP, and the ranks of its relevant items that the precision-recall curves are
drawn from. The nearest items of the queries shown are sorted from the kernel's distances.
"""
import numpy as np

from bengrapheme import report
from retrieval.fragments import metrics

LABELINGS = ('writer', 'page')
METRIC_NAMES = {'map': 'mAP', 'top1': 'Top-1', 'pr10': 'Pr@10', 'pr100': 'Pr@100'}
RECALL_LEVELS = np.linspace(0.0, 1.0, 21)
TOP_K = 8  # results shown per query
NUM_QUERIES = 6  # queries shown, from the best to the worst writer AP
SIZE_BINS = 8  # AP against size: mean AP of each eighth of the queries by size
MAX_POINTS = 2000  # scatter dots drawn (the binned means use every query)
THUMB = 96  # px


def pr_curve(ranks):
  """Interpolated precision at each of RECALL_LEVELS, averaged over the queries with a
  relevant item, from the ranks of each query's relevant items ([N, R], ascending, padded
  with 0: retrieval.fragments.metrics' per_query `ranks`)."""
  found = (ranks > 0).sum(axis=1)
  ranks, found = ranks[found > 0], found[found > 0]
  if not len(ranks):
    return np.zeros(len(RECALL_LEVELS))
  i = np.arange(1, ranks.shape[1] + 1)
  precision = np.where(ranks > 0, i / np.maximum(ranks, 1), 0.0)
  # Interpolated precision at recall R: the best precision at any recall >= R.
  best = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
  at = np.maximum(np.ceil(RECALL_LEVELS * found[:, None] - 1e-9) - 1, 0).astype(int)
  return np.take_along_axis(best, at, axis=1).mean(axis=0)


def nearest(embeddings, queries, metric, top_k=TOP_K):
  """[len(queries), top_k] each query's nearest other items, nearest first (ties by index)."""
  d = metrics.distance_matrix(embeddings, metric=metric, rows=queries)
  d[np.arange(len(queries)), queries] = np.inf  # the query itself is never retrieved
  return np.argsort(d, axis=1, kind='stable')[:, :min(top_k, d.shape[1] - 1)]


def sections(split, scores, details, src, listing):
  """The report of one split: scores as the evaluator returns them (nested), details its
  per-method embeddings, metric, per-query AP and relevant ranks, src the split's
  PatchSource and listing its reader.FragmentSource (the fragments themselves, for
  thumbnails)."""
  ranked = {method: (d['ap'], {labeling: pr_curve(r) for labeling, r in d['ranks'].items()})
            for method, d in details.items()}
  return [report.tag('h2', f'Fragments: split {split!r}'),
          report.note(f'{len(src.names):,} fragments ({len(src):,} patches) of '
                      f'{len(np.unique(src.writer_ids)):,} writers and '
                      f'{len(np.unique(src.page_ids)):,} pages; every fragment is a query '
                      'against all others.'),
          *methods(scores), *pr_curves(ranked), *ap_against_size(ranked, src.valid_pixels),
          *query_grid(details['encoder'], src, listing)]


def methods(scores):
  names = [name for name, block in scores.items() if isinstance(block, dict) and 'writer' in block]
  columns = [(labeling, k) for labeling in LABELINGS for k in METRIC_NAMES]
  headers = [f'{labeling} {METRIC_NAMES[k]}' for labeling, k in columns]
  rows = [[name, *[scores[name][labeling][k] for labeling, k in columns]] for name in names]
  chart = report.bar_chart(headers, {name: row[1:] for name, row in zip(names, rows)},
                           title='Retrieval scores by method', y_label='score', width=900)
  parts = [report.tag('h3', 'Encoder vs SRS-LBP'), report.note(
      'encoder: aggregated patch embeddings alone; configured: + the config\'s '
      'post-processing; tuned: + the post-processing chosen on the val split (power, '
      'PCA-whitening, SGR re-ranking, fusion with SRS-LBP).'),
      report.table(['method', *headers], rows), chart]
  if 'tuned_settings' in scores:
    chosen = scores['tuned_settings']
    parts.insert(2, report.note(f"tuned: chosen on split {chosen['chosen_on']!r}: " + ', '.join(
        f'{k} {v}' for k, v in chosen.items() if k != 'chosen_on') + '.'))
  if 'srs_lbp' not in names:
    parts.insert(1, report.note('SRS-LBP is scored when config.eval.srs_lbp is on.'))
  return parts


def pr_curves(ranked):
  lines = {f'{method} {labeling}': (RECALL_LEVELS, pr[labeling])
           for method, (_, pr) in ranked.items() for labeling in LABELINGS}
  return [report.tag('h3', 'Precision-recall curve'),
          report.note('Precision at each recall level, interpolated (the best precision at '
                      'that recall or higher), averaged over the queries with a relevant item.'),
          report.xy_chart(lines=lines, title='Precision-recall', x_label='recall',
                          y_label='precision', y_range=(0.0, 1.0), width=640, height=380)]


def ap_against_size(ranked, valid_pixels):
  charts = []
  for labeling in LABELINGS:
    lines, points = {}, {}
    for method, (ap, _) in ranked.items():
      queries = np.flatnonzero(np.isfinite(ap[labeling]))
      if not len(queries):
        continue
      by_size = np.array_split(queries[np.argsort(valid_pixels[queries], kind='stable')],
                               min(SIZE_BINS, len(queries)))
      lines[method] = ([np.median(valid_pixels[b]) for b in by_size],
                       [ap[labeling][b].mean() for b in by_size])
      if method == 'encoder':
        step = max(1, len(queries) // MAX_POINTS)
        points[method] = valid_pixels[queries[::step]], ap[labeling][queries[::step]]
    charts.append(report.xy_chart(
        lines=lines, points=points, title=f'{labeling} retrieval: AP against fragment size',
        x_label='valid (non-black) pixels of the query fragment', y_label='AP', log_x=True,
        y_range=(0.0, 1.0)))
  return [report.tag('h3', 'AP against fragment size'),
          report.note('Dots: the AP of each query fragment (encoder). Lines: the mean AP of '
                      f'each of {SIZE_BINS} equal groups of queries by size, drawn at their '
                      'median size (as in the HisFrag20 paper: small fragments are hard).'),
          report.row(*charts)]


def _thumbnail(src, listing, i, colour, caption):
  return report.tag('figure', report.png(listing.read_rgb(int(i)), fit=THUMB, alt=src.names[i],
                                         style=f'border: 3px solid {colour}'),
                    report.tag('figcaption', caption))


def query_grid(encoder, src, listing):
  ap = encoder['ap']
  queries = np.flatnonzero(np.isfinite(ap['writer']))
  queries = queries[np.argsort(-ap['writer'][queries], kind='stable')]
  shown = queries[np.unique(np.linspace(0, len(queries) - 1, min(NUM_QUERIES, len(queries)))
                            .round().astype(int))]
  top = nearest(encoder['embeddings'], shown, encoder['metric'])
  rows = []
  for q, top_q in zip(shown, top):
    cells = [_thumbnail(src, listing, q, '#1f77b4', f'{src.names[q]} AP {ap["writer"][q]:.2f}')]
    for rank, i in enumerate(top_q, 1):
      same_writer = src.writer_ids[i] == src.writer_ids[q]
      what = ('same page' if src.page_ids[i] == src.page_ids[q] else
              'same writer' if same_writer else 'other writer')
      cells.append(_thumbnail(src, listing, i, report.RIGHT if same_writer else report.WRONG,
                              f'{rank}. {what}'))
    rows.append(cells)
  return [report.tag('h3', 'Queries and their top results'),
          report.note(f'Encoder: queries (blue) from the best to the worst writer AP, each '
                      f'with its {top.shape[1]} nearest fragments; green: same writer (right), '
                      'red: another writer (wrong).'),
          report.table(['query', *[f'rank {r}' for r in range(1, top.shape[1] + 1)]], rows)]
