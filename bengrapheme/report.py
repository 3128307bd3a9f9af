"""WORKDIR/eval/report.html: one self-contained page (charts are inline SVG, images are PNG
data URIs), so it can be mailed, archived or opened from a bucket with nothing beside it.

Charts are drawn here by hand rather than with a plotting library: the few kinds a report
needs (lines, points, grouped bars) are short, and the stack stays jax + numpy + Pillow.
Each task's evaluator adds its own sections (bengrapheme/evaluation.py); this module holds
the page, the HTML helpers and the training curves every task shares.
"""
import base64
import html
import io
import json
import math
import os

import numpy as np
from PIL import Image

from bengrapheme import files

PALETTE = ('#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2',
           '#7f7f7f', '#bcbd22', '#17becf')
RIGHT, WRONG = '#2ca02c', '#d62728'  # marks on retrieved items and predictions
STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin-top: 22px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: middle; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.row { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.card { border: 1px solid #ddd; padding: 6px; font-size: 12px; width: 250px; }
.note { color: #666; font-size: 13px; }
figure { margin: 0; } figcaption { font-size: 11px; text-align: center; }
"""
VOID = ('img', 'meta')  # HTML elements that take no end tag


class Html(str):
  """Markup that is already HTML: `tag` and `table` insert it without escaping."""


def escape(text):
  return Html(html.escape(str(text)))


def join(*parts):
  return Html(''.join(parts))


def tag(name, *children, **attrs):
  """<name attrs>children</name>; text children are escaped, Html ones are not.

  Attribute names are Python-friendly: class_ -> class, text_anchor -> text-anchor.
  """
  attrs = ''.join(f' {k.rstrip("_").replace("_", "-")}="{html.escape(str(v))}"'
                  for k, v in attrs.items() if v is not None)
  if name in VOID:
    return Html(f'<{name}{attrs}>')
  inner = ''.join(c if isinstance(c, Html) else html.escape(str(c)) for c in children)
  return Html(f'<{name}{attrs}>{inner}</{name}>')


def fmt(value):
  """Numbers as a reader wants them in a table: 3 decimals, thousands separators for counts."""
  if isinstance(value, (int, np.integer)):
    return f'{value:,}'
  if isinstance(value, (float, np.floating)):
    return '-' if not math.isfinite(value) else f'{value:.3f}'
  return value


def table(header, rows):
  """An HTML table; cells are text (escaped), numbers (formatted) or Html."""
  def cell(name, value):
    number = isinstance(value, (int, float, np.integer, np.floating))
    return tag(name, fmt(value), class_='num' if number else None)

  head = tag('tr', *[cell('th', h) for h in header])
  body = [tag('tr', *[cell('td', v) for v in row]) for row in rows]
  return tag('table', head, *body)


def png(image, fit=None, **attrs):
  """<img attrs> of a uint8 array [H, W], [H, W, 1], [H, W, 3] or a PIL image, inlined as PNG;
  `fit`: shrunk to fit a fit x fit box first (keeps the page small)."""
  if not isinstance(image, Image.Image):
    array = np.asarray(image)
    image = Image.fromarray(array[..., 0] if array.ndim == 3 and array.shape[2] == 1 else array)
  if fit:
    image = image.copy()
    image.thumbnail((fit, fit), Image.Resampling.LANCZOS)
  buffer = io.BytesIO()
  image.save(buffer, 'PNG', optimize=True)
  data = base64.b64encode(buffer.getvalue()).decode('ascii')
  return tag('img', src=f'data:image/png;base64,{data}', **attrs)


def row(*items):
  return tag('div', *items, class_='row')


def note(text):
  return tag('p', text, class_='note')


# ---------------------------------------------------------------- charts

WIDTH, HEIGHT = 560, 320
MARGIN = dict(left=62, right=16, bottom=48)  # the top depends on the legend


def _ticks(lo, hi, log, count=5):
  """(axis lo, axis hi, tick values): round numbers; on a log axis powers of ten, and lo, hi
  their exponents."""
  if log:
    lo, hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    hi = max(hi, lo + 1)
    return lo, hi, [10.0 ** e for e in range(lo, hi + 1)]
  if hi - lo < 1e-12:
    lo, hi = lo - 0.5, hi + 0.5
  raw = (hi - lo) / count
  magnitude = 10 ** math.floor(math.log10(raw))
  step = next(s * magnitude for s in (1, 2, 5, 10) if s * magnitude >= raw)
  lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
  return lo, hi, [lo + i * step for i in range(round((hi - lo) / step) + 1)]


def _tick_labels(ticks):
  """Tick values as people write them: 0.25, 1500, 20k, 3M (as few decimals as the step has)."""
  step = min((abs(b - a) for a, b in zip(ticks, ticks[1:])), default=1) or 1
  if max(abs(t) for t in ticks) >= 1e4 and step >= 1:
    return [_si(t) for t in ticks]
  decimals = min(max(0, -math.floor(math.log10(step) + 1e-9)), 9)
  return [f'{t:.{decimals}f}' for t in ticks]


def _si(value):
  for unit, suffix in ((1e9, 'G'), (1e6, 'M'), (1e3, 'k')):
    if abs(value) >= unit:
      return f'{value / unit:g}{suffix}'
  return f'{value:g}'


def _frame(title, x_label, y_label, legend, width, height):
  """The SVG's title, legend (rows of coloured names under the title) and axis labels.

  Returns (parts, (left, right, top, bottom)): the plot area below the legend.
  """
  left, right, bottom = MARGIN['left'], width - MARGIN['right'], height - MARGIN['bottom']
  parts = [tag('text', title, x=width / 2, y=16, text_anchor='middle', font_weight='bold')]
  x, y = left, 27
  for name, colour in legend:
    item = 24 + 6.5 * len(name)  # about the width of 11 px sans-serif text
    if x + item > right and x > left:
      x, y = left, y + 15
    parts.append(tag('rect', x=x, y=y, width=10, height=10, fill=colour))
    parts.append(tag('text', name, x=x + 14, y=y + 9))
    x += item
  top = y + 19 if legend else 28
  middle = (top + bottom) / 2
  parts.append(tag('text', x_label, x=(left + right) / 2, y=height - 8, text_anchor='middle'))
  parts.append(tag('text', y_label, x=14, y=middle, text_anchor='middle',
                   transform=f'rotate(-90 14 {middle})'))
  return parts, (left, right, top, bottom)


def _svg(parts, title, width, height):
  return tag('svg', tag('title', title), *parts, xmlns='http://www.w3.org/2000/svg',
             width=width, height=height, viewBox=f'0 0 {width} {height}', font_size=11,
             font_family='sans-serif', role='img')


def xy_chart(*, lines=None, points=None, title, x_label, y_label, log_x=False,
             y_range=None, width=WIDTH, height=HEIGHT):
  """Line and scatter series on shared axes.

  lines, points: {name: (xs, ys)}; a name in both (e.g. a scatter and its binned mean) gets
  one colour and one legend entry. Non-finite values (and x <= 0 on a log axis) are skipped.
  """
  lines, points = lines or {}, points or {}
  names = list(dict.fromkeys([*lines, *points]))
  colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}

  def clean(xs, ys):
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    keep = np.isfinite(xs) & np.isfinite(ys) & ((xs > 0) if log_x else True)
    return xs[keep], ys[keep]

  series = {(kind, name): clean(*xy) for kind, group in (('line', lines), ('point', points))
            for name, xy in group.items()}
  xs = np.concatenate([xy[0] for xy in series.values()] + [np.zeros(0)])
  ys = np.concatenate([xy[1] for xy in series.values()] + [np.zeros(0)])
  parts, (left, right, top, bottom) = _frame(title, x_label, y_label,
                                             [(n, colour[n]) for n in names], width, height)
  if not len(xs):
    parts.append(tag('text', 'no data', x=width / 2, y=height / 2, text_anchor='middle'))
    return _svg(parts, title, width, height)
  x0, x1, x_ticks = _ticks(xs.min(), xs.max(), log_x)
  y0, y1, y_ticks = _ticks(*(y_range or (ys.min(), ys.max())), False)

  def px(x):
    x = np.log10(x) if log_x else x
    return left + (x - x0) / (x1 - x0) * (right - left)

  def py(y):
    return bottom - (np.clip(y, y0, y1) - y0) / (y1 - y0) * (bottom - top)

  for t, label in zip(x_ticks, _tick_labels(x_ticks)):
    parts.append(tag('line', x1=px(t), x2=px(t), y1=top, y2=bottom, stroke='#eee'))
    parts.append(tag('text', label, x=px(t), y=bottom + 14, text_anchor='middle'))
  for t, label in zip(y_ticks, _tick_labels(y_ticks)):
    parts.append(tag('line', x1=left, x2=right, y1=py(t), y2=py(t), stroke='#eee'))
    parts.append(tag('text', label, x=left - 4, y=py(t) + 4, text_anchor='end'))
  parts.append(tag('rect', x=left, y=top, width=right - left, height=bottom - top,
                   fill='none', stroke='#999'))
  for (kind, name), (sx, sy) in series.items():
    if kind == 'point':
      parts.extend(tag('circle', cx=f'{a:.1f}', cy=f'{b:.1f}', r=2.2, fill=colour[name],
                       fill_opacity=0.45) for a, b in zip(px(sx), py(sy)))
    elif len(sx):
      path = ' '.join(f'{a:.1f},{b:.1f}' for a, b in zip(px(sx), py(sy)))
      parts.append(tag('polyline', points=path, fill='none', stroke=colour[name],
                       stroke_width=1.8))
      if len(sx) <= 30:  # short series: show where the measurements are
        parts.extend(tag('circle', cx=f'{a:.1f}', cy=f'{b:.1f}', r=2.5, fill=colour[name])
                     for a, b in zip(px(sx), py(sy)))
  return _svg(parts, title, width, height)


def bar_chart(categories, groups, *, title, y_label, y_range=(0.0, 1.0), label_every=1,
              width=WIDTH, height=HEIGHT):
  """Grouped bars: groups {name: one value per category}; NaN values draw no bar, zero a
  sliver (so "measured 0" differs from "nothing to measure")."""
  names = list(groups)
  legend = [(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)] if len(names) > 1 else []
  parts, (left, right, top, bottom) = _frame(title, '', y_label, legend, width, height)
  y0, y1, y_ticks = _ticks(*y_range, False)
  py = lambda y: bottom - (min(max(y, y0), y1) - y0) / (y1 - y0) * (bottom - top)
  for t, label in zip(y_ticks, _tick_labels(y_ticks)):
    parts.append(tag('line', x1=left, x2=right, y1=py(t), y2=py(t), stroke='#eee'))
    parts.append(tag('text', label, x=left - 4, y=py(t) + 4, text_anchor='end'))
  slot = (right - left) / max(len(categories), 1)
  bar = slot * 0.8 / max(len(names), 1)
  for c, category in enumerate(categories):
    for g, name in enumerate(names):
      value = float(groups[name][c])
      if math.isfinite(value):
        x, y = left + c * slot + slot * 0.1 + g * bar, min(py(value), bottom - 2)
        parts.append(tag('rect', tag('title', f'{name} {category}: {value:.3f}'), x=f'{x:.1f}',
                         y=f'{y:.1f}', width=f'{max(bar - 0.5, 0.5):.1f}',
                         height=f'{bottom - y:.1f}', fill=PALETTE[g % len(PALETTE)]))
    if c % label_every == 0:
      parts.append(tag('text', category, x=left + (c + 0.5) * slot, y=bottom + 14,
                       text_anchor='middle'))
  parts.append(tag('line', x1=left, x2=right, y1=bottom, y2=bottom, stroke='#999'))
  return _svg(parts, title, width, height)


# ---------------------------------------------------------------- training curves

# Training-log keys not worth a chart: a 0/1 flag that stays 0 on a healthy run.
UNCHARTED = ('nonfinite',)


def read_training_log(workdir):
  """Rows of WORKDIR/metrics.jsonl (one dict per logged step); [] when there is none."""
  text = files.read_text(files.join(workdir, 'metrics.jsonl')) or ''
  return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith('\n')]


def training_curves(workdir):
  """Charts of the training log: losses, evaluation scores during training, the rest."""
  rows = read_training_log(workdir)
  if not rows:
    return [note(f'No training log ({os.path.join(workdir, "metrics.jsonl")}).')]

  def series(key):
    pairs = [(r['step'], r[key]) for r in rows if key in r]
    return tuple(zip(*pairs))

  keys = list(dict.fromkeys(k for r in rows for k in r if k != 'step'))
  losses = [k for k in sorted(keys, key=lambda k: k != 'loss')  # the total first
            if k == 'loss' or k.startswith('ce_')]
  # Evaluations during training log every metric as split/...; their scores tell the story.
  scores = [k for k in keys if k.count('/') == 1 and k.endswith('/score')]
  others = [k for k in keys if '/' not in k and k not in losses and k not in UNCHARTED]
  charts = [xy_chart(lines={k: series(k) for k in losses}, title='Training loss', x_label='step',
                     y_label='loss')] if losses else []
  if scores:
    charts.append(xy_chart(lines={k: series(k) for k in scores}, title='Evaluation score',
                           x_label='step', y_label='score'))
  charts += [xy_chart(lines={k: series(k)}, title=k, x_label='step', y_label=k, width=420,
                      height=260) for k in others]
  return [row(*charts)]


# ---------------------------------------------------------------- the page


def page(title, *body):
  return Html('<!DOCTYPE html>\n' + tag(
      'html', tag('head', tag('meta', charset='utf-8'), tag('title', title),
                  tag('style', Html(STYLE))),
      tag('body', tag('h1', title), *body), lang='en'))


def write(config, workdir, step, sections):
  """Writes WORKDIR/eval/report.html (atomically): the training curves, then `sections`
  (what each evaluator's report_sections gave); returns its path."""
  body = [note(f'Task {config.task}, checkpoint at step {step}, workdir {workdir}.'),
          tag('h2', 'Training curves'), *training_curves(workdir), *sections]
  title = f'Evaluation report: {os.path.basename(workdir.rstrip("/"))}'
  return files.write_atomic(files.join(workdir, 'eval', 'report.html'), page(title, *body))
