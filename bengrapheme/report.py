"""WORKDIR/eval/report.html: one self-contained page (charts are inline SVG, images are PNG
data URIs), so it can be mailed, archived or opened from a bucket with nothing beside it.

Charts are drawn by matplotlib's SVG backend (the field's plotting library: axes, ticks and
legends done right, no hand-written layout code to keep).
Each task's evaluator adds its own sections (bengrapheme/inference.py); this module holds
the page, the HTML helpers and the training curves every task shares.
"""
import base64
import html
import io
import json
import math
import os

import matplotlib
import numpy as np
from matplotlib.figure import Figure
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


def summary_sections(title, summary):
  """An evaluator's report that is its summary (header, rows, note) under a title."""
  header, rows, text = summary
  return [tag('h2', title), table(header, rows), note(text)]


# ---------------------------------------------------------------- charts

WIDTH, HEIGHT = 560, 320  # CSS px
# Text stays text in the SVG (searchable, a third of the size of glyphs drawn as paths).
STYLE_RC = {'svg.fonttype': 'none', 'font.size': 9, 'axes.titlesize': 10,
            'axes.titleweight': 'bold', 'axes.prop_cycle': matplotlib.cycler(color=PALETTE)}


def _figure(width, height):
  # 96 figure dpi: the SVG's size in pt then renders at `width` x `height` CSS px.
  figure = Figure(figsize=(width / 96, height / 96), dpi=96, layout='constrained')
  return figure, figure.add_subplot()


def _svg(figure, ax, title, legend, legend_below=False):
  """legend_below: under the axes, for charts whose bars fill the plot (inside, the legend
  would cover them)."""
  ax.set_title(title)
  ax.grid(True, color='#eee')
  ax.set_axisbelow(True)
  if legend and legend_below:
    figure.legend(loc='outside lower center', ncol=4, fontsize=8, frameon=False)
  elif legend:
    ax.legend(fontsize=8, frameon=False)
  buffer = io.StringIO()
  figure.savefig(buffer, format='svg')
  text = buffer.getvalue()
  return Html(text[text.index('<svg'):])  # inline: no XML prolog or DOCTYPE


def xy_chart(*, lines=None, points=None, title, x_label, y_label, log_x=False,
             y_range=None, width=WIDTH, height=HEIGHT):
  """Line and scatter series on shared axes, as inline SVG.

  lines, points: {name: (xs, ys)}; a name in both (e.g. a scatter and its binned mean) gets
  one colour and one legend entry. Non-finite values (and x <= 0 on a log axis) are skipped.
  """
  lines, points = lines or {}, points or {}
  names = list(dict.fromkeys([*lines, *points]))

  def clean(xs, ys):
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    keep = np.isfinite(xs) & np.isfinite(ys) & ((xs > 0) if log_x else True)
    return xs[keep], ys[keep]

  with matplotlib.rc_context(STYLE_RC):
    figure, ax = _figure(width, height)
    drawn = 0
    for i, name in enumerate(names):
      colour = PALETTE[i % len(PALETTE)]
      if name in lines:
        xs, ys = clean(*lines[name])
        # Short series: show where the measurements are.
        ax.plot(xs, ys, color=colour, linewidth=1.8, marker='o' if len(xs) <= 30 else None,
                markersize=3, label=name)
        drawn += len(xs)
      if name in points:
        xs, ys = clean(*points[name])
        ax.scatter(xs, ys, s=6, color=colour, alpha=0.45, linewidths=0,
                   label=None if name in lines else name)
        drawn += len(xs)
    if not drawn:
      ax.text(0.5, 0.5, 'no data', transform=ax.transAxes, ha='center', va='center')
    if log_x and drawn:
      ax.set_xscale('log')
    if y_range:
      ax.set_ylim(*y_range)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    return _svg(figure, ax, title, legend=bool(drawn) and bool(names))


def bar_chart(categories, groups, *, title, y_label, y_range=(0.0, 1.0), label_every=1,
              width=WIDTH, height=HEIGHT):
  """Grouped bars as inline SVG: groups {name: one value per category}; NaN values draw no
  bar, zero a sliver (so "measured 0" differs from "nothing to measure")."""
  names = list(groups)
  x = np.arange(len(categories))
  bar = 0.8 / max(len(names), 1)
  with matplotlib.rc_context(STYLE_RC):
    figure, ax = _figure(width, height)
    sliver = 0.006 * (y_range[1] - y_range[0])
    for g, name in enumerate(names):
      values = np.asarray(groups[name], np.float64)
      ax.bar(x + (g - (len(names) - 1) / 2) * bar, np.where(values == 0, sliver, values),
             bar * 0.95, label=name, color=PALETTE[g % len(PALETTE)])
    ax.set_xticks(x[::label_every], [str(c) for c in categories][::label_every])
    ax.set_xlim(-0.5, len(categories) - 0.5)
    ax.set_ylim(*y_range)
    ax.set_ylabel(y_label)
    return _svg(figure, ax, title, legend=len(names) > 1, legend_below=True)


# ---------------------------------------------------------------- training curves

def read_training_log(workdir):
  """Rows of WORKDIR/metrics.jsonl (one dict per logged step); [] when there is none."""
  text = files.read_text(files.join(workdir, 'metrics.jsonl')) or ''
  return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith('\n')]


def training_curves(workdir):
  """Charts of the training log: losses, evaluation scores during training, the rest. Each
  logged value is the mean over the steps since the previous log line (bengrapheme/train.py),
  and loss_max the largest single-step loss among them. A value that never changed (e.g.
  the count of NaN steps on a healthy run) gets a line of text, not a flat chart."""
  rows = read_training_log(workdir)
  if not rows:
    return [note(f'No training log ({os.path.join(workdir, "metrics.jsonl")}).')]

  def series(key):
    pairs = [(r['step'], r[key]) for r in rows if key in r]
    return tuple(zip(*pairs))

  keys = list(dict.fromkeys(k for r in rows for k in r if k != 'step'))
  constant = [k for k in keys if len(rows) > 1 and len(set(series(k)[1])) == 1]
  keys = [k for k in keys if k not in constant]
  losses = [k for k in sorted(keys, key=lambda k: (k != 'loss', k != 'loss_max'))
            if k in ('loss', 'loss_max') or k.startswith('ce_')]
  # Evaluations during training log every metric as split/...; their scores tell the story.
  scores = [k for k in keys if k.count('/') == 1 and k.endswith('/score')]
  others = [k for k in keys if '/' not in k and k not in losses]
  charts = [xy_chart(lines={k: series(k) for k in losses}, x_label='step', y_label='loss',
                     title='Training loss (mean of each log interval; loss_max: its worst step)')
            ] if losses else []
  if scores:
    charts.append(xy_chart(lines={k: series(k) for k in scores}, title='Evaluation score',
                           x_label='step', y_label='score'))
  charts += [xy_chart(lines={k: series(k)}, title=k, x_label='step', y_label=k, width=420,
                      height=260) for k in others]
  flat = [f'{k} = {fmt(series(k)[1][0])}' for k in constant if '/' not in k]
  return [row(*charts)] + ([note('Constant throughout training: ' + ', '.join(flat) + '.')]
                           if flat else [])


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
