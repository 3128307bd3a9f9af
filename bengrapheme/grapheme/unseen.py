"""Which graphemes training never sees: the honest measure of unseen-grapheme accuracy.

Rendering every valid combination into training (bengrapheme/grapheme/rendered.py) would make
"unseen" test graphemes seen. So, seeded by config.unseen.seed and independent of the training
seed, two sets are held out of everything training reads:

- `never_rendered`: a fraction config.unseen.never_rendered of the valid unseen triples
  (classes.unseen_triples), never rendered;
- `val_graphemes`: a fraction config.unseen.val_graphemes of the real graphemes, whose real
  images form the validation split's held-out graphemes (data.py) and are never rendered.

Every image then falls into one category, by its label triple:
  seen                   a real grapheme training reads real images of;
  unseen_rendered        not among those, but rendered into training (the render pool);
  unseen_never_rendered  anything else: the held-out triples and graphemes, or any triple the
                         renderer cannot draw. The README's headline figure.
With rendering switched off the categories stay the same (the pool is what rendering would
draw), so runs with and without it are scored on the same images.
"""
import functools

import numpy as np

from bengrapheme.grapheme import classes

CATEGORIES = ('seen', 'unseen_rendered', 'unseen_never_rendered')


@functools.cache
def _holdout(seed, never_rendered, val_graphemes):
  rng = np.random.default_rng([seed, 11])
  unseen = classes.unseen_triples()
  held = rng.permutation(len(unseen))[:round(len(unseen) * never_rendered)]
  real = sorted(classes.REAL_TRIPLES)
  val = rng.permutation(len(real))[:round(len(real) * val_graphemes)]
  return frozenset(unseen[i] for i in held), frozenset(real[i] for i in val)


def held_out(config):
  """(never_rendered triples, validation grapheme triples): frozensets of (r, v, c)."""
  u = config.unseen
  return _holdout(u.seed, u.never_rendered, u.val_graphemes)


def render_pool(config):
  """Every valid triple rendering may draw: real and unseen, minus both held-out sets."""
  never, val = held_out(config)
  pool = classes.REAL_TRIPLES.union(classes.unseen_triples()) - never - val
  return sorted(pool)


def contains(triples, labels):
  """bool [N]: whether each label triple (labels int [N, 3]) is among `triples`."""
  return np.isin(_keys(labels), _keys(sorted(triples)))


def _keys(labels):
  """One integer per (root, vowel, consonant) triple, so membership is one np.isin."""
  labels = np.asarray(labels, np.int64).reshape(-1, 3)
  return (labels[:, 0] * 16 + labels[:, 1]) * 16 + labels[:, 2]


def categories(config, labels):
  """The category index (into CATEGORIES) of each label triple, labels int [N, 3]."""
  never, val = held_out(config)
  seen = contains(classes.REAL_TRIPLES - val, labels)
  rendered = contains(frozenset(classes.unseen_triples()) - never, labels)
  return np.where(seen, 0, np.where(rendered, 1, 2)).astype(np.int32)
