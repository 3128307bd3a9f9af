"""The grapheme sections of report.html: scores, seen vs unseen graphemes, recall per class,
the most confused class pairs and misclassified images, with classes drawn as Bengali glyphs.

Glyphs are drawn here (Pillow + raqm, the synthetic generator's font and shaping) rather than
left to the browser, so the page shows correct conjuncts whatever fonts its viewer has.
"""
import functools

import numpy as np
from PIL import Image, ImageOps

from bengrapheme import report
from bengrapheme.grapheme import classes, kaggle, metrics, synth, unseen

GLYPH_FONT = 'Noto Sans Bengali'
GLYPH_SCALE = 0.4  # of synth.FONT_SIZE (96 px): text about 38 px high
SHORT = dict(zip(kaggle.COMPONENTS, ('root', 'vowel', 'consonant')))
NUM_PAIRS = 12  # most confused (true, predicted) pairs listed, over all components
NUM_WEAKEST = 5  # classes of lowest recall listed per component
NUM_SAMPLES = 12  # misclassified images shown


@functools.cache
def glyph(text):
  """Bengali text as an inline image; the text itself where the Debian font is missing."""
  try:
    ink = synth._draw_text(text, GLYPH_FONT)
  except FileNotFoundError:  # e.g. on a Kaggle machine: the viewer's fonts will have to do
    return report.tag('span', text, lang='bn')
  size = [max(1, round(n * GLYPH_SCALE)) for n in ink.size]
  return report.png(ImageOps.invert(ink.resize(size, Image.Resampling.LANCZOS)), alt=text,
                    style='vertical-align: middle')


def component_glyph(component, label):
  """A class as its class-map string drawn, followed by its label."""
  text = classes.component_string(component, label)
  shown = 'none' if text == classes.NONE_LABEL else glyph(text)
  return report.join(report.tag('span', shown), report.escape(f' {label}'))


def sections(split, scores, details, source):
  """The report of one split: scores as the evaluator returns them (nested), details its
  per-image arrays, source the split's images (row i of the details is source[i])."""
  rule = 'combined'
  labels, predictions = details['labels'], details['predictions']
  confusion = metrics.confusion_from_labels(labels, predictions)
  return [
      report.tag('h2', f'Graphemes: split {split!r}'),
      report.note(f'{scores["num_images"]:,} images: {images_by_category(scores)}. '
                  f'Prediction rule {rule!r}; sections below show it over all images.'),
      *tuning(scores),
      *seen_vs_unseen(scores),
      *per_component_recall(scores, rule, confusion),
      *confused_pairs(confusion),
      *misclassified(details, source)]


def images_by_category(scores):
  """'304 of graphemes training has real images of (seen), 800 of ...', without the
  categories the split has no image of."""
  described = {
      'seen': 'of graphemes training has real images of (seen)',
      'unseen_rendered': 'of graphemes training has only rendered images of (unseen_rendered)',
      'unseen_never_rendered': 'of graphemes training never saw, real or rendered '
                               '(unseen_never_rendered)'}
  return ', '.join(f'{scores[f"num_{name}"]:,} {text}' for name, text in described.items()
                   if scores.get(f'num_{name}'))


def seen_vs_unseen(scores):
  rules = [r for r in ('heads', 'combined', 'chosen') if r in scores]
  keys = ('score', *kaggle.COMPONENTS)
  rows = [[rule, subset, *[by_subset[k] for k in keys]]
          for rule in rules for subset, by_subset in scores[rule].items()]
  charts = [report.bar_chart(
      ['score', *SHORT.values()],
      {subset: [by_subset[k] for k in keys] for subset, by_subset in scores[rule].items()},
      title=f'{rule}: hierarchical macro recall', y_label='macro recall', width=420)
      for rule in rules]
  return [report.tag('h3', 'Seen vs unseen graphemes'),
          report.note("seen: training reads real images of the grapheme; unseen_rendered: "
                      "only rendered images of it; unseen_never_rendered: neither (held-out "
                      "combinations and validation graphemes: the private leaderboard's hard "
                      "part). 'heads': argmax of the component heads; 'combined': the "
                      "prediction rule (prior correction, and the whole-grapheme head where "
                      "it is confident); 'chosen': that rule with the settings "
                      "eval.tune_split's split chose."),
          report.table(['rule', 'graphemes', 'score', *SHORT.values()], rows),
          report.row(*charts)]


def tuning(scores):
  if 'tuned' not in scores:
    return []
  t = scores['tuned']
  return [report.note(
      f"Tuned on this split (mean score over its categories): tau {t['tau']}, seen threshold "
      f"{t['seen_threshold']} reach {t['balanced_score']:.4f}; the configured rule "
      f"{t['configured_balanced_score']:.4f}.")]


def per_component_recall(scores, rule, confusion):
  charts, weakest = [], []
  for component, matrix in zip(kaggle.COMPONENTS, confusion):
    support = matrix.sum(1)
    recall = np.where(support > 0, np.diag(matrix) / np.maximum(support, 1), np.nan)
    many = len(recall) > 20
    charts.append(report.bar_chart(
        [str(c) for c in range(len(recall))], {'recall': recall},
        title=f'{component}: recall per class (macro {scores[rule]["all"][component]:.3f})',
        y_label='recall', label_every=10 if many else 1, width=1100 if many else 420))
    for c in np.argsort(np.where(support > 0, recall, np.inf), kind='stable')[:NUM_WEAKEST]:
      if support[c]:
        off = np.where(np.arange(len(recall)) == c, -1, matrix[c])
        weakest.append([SHORT[component], component_glyph(component, int(c)), recall[c],
                        int(support[c]), component_glyph(component, int(off.argmax()))
                        if off.max() > 0 else '-'])
  return [report.tag('h3', 'Per-component recall'),
          report.note('Recall of each class over all images; a class with no image has no '
                      'bar. Macro recall is the mean over the classes present.'),
          report.row(*charts),
          report.table(['component', 'weakest classes', 'recall', 'images',
                        'most often predicted instead'], weakest)]


def confused_pairs(confusion):
  cells = []
  for component, matrix in zip(kaggle.COMPONENTS, confusion):
    off = matrix * (1 - np.eye(len(matrix), dtype=matrix.dtype))
    cells += [(int(off[t, p]), component, int(t), int(p), int(matrix[t].sum()))
              for t, p in zip(*np.nonzero(off))]
  rows = [[SHORT[component], component_glyph(component, t), component_glyph(component, p),
           count, count / support]
          for count, component, t, p, support in sorted(cells, key=lambda c: -c[0])[:NUM_PAIRS]]
  return [report.tag('h3', 'Most confused class pairs'),
          report.table(['component', 'true class', 'predicted', 'images',
                        'share of the true class'], rows) if rows else
          report.note('No component was ever confused.')]


def _triple(values, wrong):
  return report.join(*[report.tag('span', f'{SHORT[c]} {v} ',
                                  style=f'color: {report.WRONG}' if w else None)
                       for c, v, w in zip(kaggle.COMPONENTS, values, wrong)])


def misclassified(details, source):
  labels, predictions = details['labels'], details['predictions']
  wrong = np.flatnonzero((labels != predictions).any(1))
  picks = wrong[np.unique(np.linspace(0, len(wrong) - 1, min(NUM_SAMPLES, len(wrong)))
                          .round().astype(int))] if len(wrong) else []
  cards = []
  for k in picks:
    image = source[int(k)]['image']
    y, p = labels[k], predictions[k]
    cards.append(report.tag(
        'div', report.png(image, width=177, alt='image'),
        report.tag('div', 'true ', glyph(classes.compose(*map(int, y))), ' ',
                   _triple(y, y != p)),
        report.tag('div', 'predicted ', glyph(classes.compose(*map(int, p))), ' ',
                   _triple(p, y != p)),
        report.tag('div', unseen.CATEGORIES[details['category'][k]].replace('_', ' '),
                   class_='note'),
        class_='card'))
  return [report.tag('h3', 'Misclassified samples'),
          report.note(f'{len(wrong):,} of {len(labels):,} images have a component wrong '
                      '(in red); a spread of them:'),
          report.row(*cards)]
