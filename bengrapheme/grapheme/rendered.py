"""Rendered graphemes mixed into training: the 1st and 7th places' answer to unseen graphemes.

Real training data shows 1,295 of the ~11,000 valid root + vowel + consonant combinations, so
component heads learn their co-occurrences (91 % of the unseen triples carry a consonant
diacritic; class 3 occurs in 4 training graphemes). Here `config.render.images` images are drawn
over the whole render pool (unseen.render_pool: every valid triple minus the held-out ones),
evenly over components: a root uniformly, then a vowel uniformly among those valid with it,
then a consonant diacritic likewise. Each is drawn by the synthetic generator's renderer
(bengrapheme/grapheme/synth.py: a training font, handwriting-like warps), ahead of training,
into a bengrapheme/cache.py entry in the prepared layout (prepare.py), so grain reads it as it
reads real images. The trainer mixes it in at config.render.fraction of every batch (data.py).

Drawing is done once per (settings, fonts), in parallel over the cores; the cache key holds
the settings and the font files.
"""
import collections
import os

import numpy as np

from bengrapheme import cache, console, errors, files
from bengrapheme.grapheme import classes, kaggle, prepare, synth, unseen

RENDER_CODE = 2  # the generator seed's split code: synth uses 0 (train) and 1 (test)
PLAN_VERSION = 2  # 2: synth.render draws monoline pens, stronger warps and pen breaks


def plan(config):
  """Rows (root, vowel, consonant, grapheme, text to draw, font) of the rendered images."""
  by_root = collections.defaultdict(lambda: collections.defaultdict(list))
  for r, v, c in unseen.render_pool(config):
    by_root[r][v].append(c)
  roots = sorted(by_root)
  rng = np.random.default_rng([config.unseen.seed, RENDER_CODE])
  rows = []
  for _ in range(config.render.images):
    root = roots[rng.integers(len(roots))]
    vowels = sorted(by_root[root])
    vowel = vowels[rng.integers(len(vowels))]
    consonants = by_root[root][vowel]
    consonant = consonants[rng.integers(len(consonants))]
    grapheme = classes.spelling(root, vowel, consonant)
    text = synth.RENDER_SPELLING.get(grapheme, grapheme)
    rows.append((root, vowel, consonant, grapheme, text,
                 synth.pick_font(rng, synth.TRAIN_FONTS, text)))
  return rows


def source(config, cache_dir):
  """The rendered images as a prepare.GraphemeSource, drawn first if not cached."""

  def build(folder):
    rows = plan(config)
    images = files.open_memmap(folder / 'images.npy', np.uint8,
                               (len(rows), kaggle.HEIGHT, kaggle.WIDTH))
    jobs = [(text, font, [config.unseen.seed, RENDER_CODE, i])
            for i, (*_, text, font) in enumerate(rows)]
    workers = config.render.workers or len(os.sched_getaffinity(0))
    with synth.parallel_map(workers) as imap, \
        console.Progress(len(jobs), 'rendering graphemes', unit='image') as progress:
      for i, image in enumerate(imap(synth.render_job, jobs)):
        images[i] = image
        progress.update()
    images.flush()
    del images
    prepare.write_index(folder, 'rendered', [f'Rendered_{i}' for i in range(len(rows))],
                        [row[3] for row in rows], [row[:3] for row in rows])

  fonts = list(synth.TRAIN_FONTS.values())
  missing = [font for font in fonts if not os.path.exists(font)]
  if missing:
    raise errors.UserError(f'config.render.fraction={config.render.fraction}: the rendered '
                           f'graphemes need {len(missing)} font(s) not installed, e.g. '
                           f'{missing[0]}; {synth.MISSING_FONT_HELP}; or train on the real '
                           'images alone: --config.render.fraction=0')
  params = dict(version=PLAN_VERSION, layout=prepare.LAYOUT_VERSION, images=config.render.images,
                unseen=config.unseen.to_dict())
  entry = cache.build_once(cache_dir, 'rendered', fonts, params, build, origin='rendered')
  return prepare.GraphemeSource(entry)
