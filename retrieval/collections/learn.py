"""Training on a collection with the scholars' decisions (--config.data.decisions=PATH).

A collection has no writer labels: its patches are trained to tell surrogate classes apart
(retrieval/features/surrogate.py). The workbench's decisions add what scholars know, beside them:
- accepted pairs (same hand), joined transitively (db.groups): all the patches of a group's
  fragments become one class, so the loss pulls the group's fragments together;
- rejected pairs (different hands): each of their fragments not in a group becomes a class
  of its own, so the loss pushes the two apart when they meet in a batch.
Unsure decisions say nothing and are left out. A batch draws half its classes from the
decisions' classes (each rejected fragment with the one it was rejected against, so the
negative is in the batch), the other half from the surrogate classes, K patches each, as the
P x K batches of retrieval/fragments/data.py.

The labels are computed once, when a run starts, and kept in WORKDIR/decisions-labels.npz,
so that a resumed run trains on the same classes even after more decisions were made.
"""
import os

import numpy as np

from bengrapheme import console, errors, files
from retrieval.collections import decisions as db_lib

SNAPSHOT = 'decisions-labels.npz'


def classes(db_path, relative_paths, fragment_of, base):
  """(labels [patches], decision classes, {class: the classes it was rejected against}):
  `base` (the surrogate class of each patch) with the decisions' classes numbered after it.
  relative_paths[f]: fragment f's path relative to the collection folder, as the index
  (and so the decisions) name it; fragment_of[i]: patch i's fragment."""
  if not os.path.isfile(db_path):
    raise errors.UserError(f'data.decisions={db_path}: no such file; expected the '
                           'workbench\'s decisions database (launch.serve --db)')
  standing = db_lib.Decisions(db_path).standing()
  row = {p: f for f, p in enumerate(relative_paths)}
  unknown = {p for pair in standing for p in pair if p not in row}
  if unknown:
    console.say(f'data.decisions: {len(unknown)} decided image(s) not among the training '
                f'images (e.g. {sorted(unknown)[0]}): their decisions are left out')
  known = {pair: d for pair, d in standing.items() if not set(pair) & unknown}
  fragment_class = {}
  next_class = int(base.max()) + 1 if len(base) else 0
  for group in db_lib.groups(known):
    for path in group:
      fragment_class[row[path]] = next_class
    next_class += 1
  rejected = [(row[a], row[b]) for (a, b), d in known.items() if d.verdict == 'different']
  for f in sorted({f for pair in rejected for f in pair} - set(fragment_class)):
    fragment_class[f] = next_class
    next_class += 1
  partners = {}
  for a, b in rejected:
    ca, cb = fragment_class[a], fragment_class[b]
    if ca != cb:  # a rejection inside a group of accepted joins is a contradiction: skipped
      partners.setdefault(ca, set()).add(cb)
      partners.setdefault(cb, set()).add(ca)
  labels = np.asarray(base, np.int32).copy()
  of_fragment = np.full(len(relative_paths), -1, np.int32)
  for f, c in fragment_class.items():
    of_fragment[f] = c
  mine = of_fragment[fragment_of]
  labels[mine >= 0] = mine[mine >= 0]
  decided = sorted(set(fragment_class.values()))
  console.say(f'data.decisions: {sum(d.verdict == "same" for d in known.values())} accepted '
              f'and {len(rejected)} rejected pairs of {db_path}: {len(decided)} classes beside '
              f'the {len(np.unique(base))} surrogate ones')
  return labels, decided, {c: sorted(p) for c, p in partners.items()}


def snapshot(workdir, db_path, relative_paths, fragment_of, base):
  """classes(), computed at a run's first start and read back from the workdir after."""
  path = os.path.join(workdir, SNAPSHOT)
  if os.path.exists(path):
    with np.load(path) as z:
      if len(z['labels']) == len(base):
        partners = {int(c): z['partners'][s:e].tolist()
                    for c, s, e in zip(z['partner_of'], z['starts'][:-1], z['starts'][1:])}
        return z['labels'], z['decided'].tolist(), partners
  labels, decided, partners = classes(db_path, relative_paths, fragment_of, base)
  owners = sorted(partners)
  with files.atomic_file(path, 'wb') as f:
    np.savez(f, labels=labels, decided=np.array(decided, np.int64),
             partner_of=np.array(owners, np.int64),
             starts=np.cumsum([0] + [len(partners[c]) for c in owners]).astype(np.int64),
             partners=np.array([p for c in owners for p in partners[c]], np.int64))
  return labels, decided, partners


class DecisionBatches:
  """Global batch b: P classes x K patches, half the classes from the decisions' (a class,
  then one it was rejected against when it has one), the rest surrogate classes; a pure
  function of (seed, b), as retrieval/fragments/data.py's PKBatches."""

  def __init__(self, labels, decided, partners, classes_per_batch, per_class, seed):
    by_class = {c: np.flatnonzero(labels == c) for c in np.unique(labels)}
    self.by_class = {c: ids for c, ids in by_class.items() if len(ids) >= 2}
    self.decided = [c for c in decided if c in self.by_class]
    self.partners = {c: [p for p in ps if p in self.by_class] for c, ps in partners.items()}
    self.others = [c for c in self.by_class if c not in set(decided)]
    self.p, self.k, self.seed = classes_per_batch, per_class, seed
    if len(self.others) < self.p:
      raise errors.UserError(f'P x K batches need {self.p} surrogate classes with 2+ patches; '
                             f'the training set has {len(self.others)}')

  def __len__(self):
    return 2**31 - 1  # endless; grain indexes batches by position

  def __getitem__(self, b):
    rng = np.random.default_rng([self.seed, b])
    chosen = []
    while self.decided and len(chosen) < self.p // 2:
      c = self.decided[rng.integers(len(self.decided))]
      if c in chosen:
        continue
      chosen.append(c)
      mates = [p for p in self.partners.get(c, []) if p not in chosen]
      if mates and len(chosen) < self.p // 2 + 1:
        chosen.append(mates[rng.integers(len(mates))])
      if len(chosen) >= len(self.decided):
        break
    chosen += [self.others[i]
               for i in rng.choice(len(self.others), self.p - len(chosen), replace=False)]
    picks = [rng.choice(self.by_class[c], self.k, replace=len(self.by_class[c]) < self.k)
             for c in chosen]
    return np.concatenate(picks)
