"""The Bengali.AI class map, derived from the 1,295 real training graphemes.

`graphemes.csv` (grapheme_root,vowel_diacritic,consonant_diacritic,grapheme; from the real
train.csv) is the only source: the Unicode string of every root, vowel diacritic and consonant
diacritic is read off the graphemes, then `compose` rebuilds graphemes from their labels.

A grapheme is written in Unicode as
  [reph] root [phala] [vowel sign] [candrabindu]
reph = র + virama (consonant diacritics 2, 3); phala = virama + য/র (3, 4, 5, 6);
candrabindu = consonant diacritic 1, which follows the vowel sign.

`compose` reproduces 1,291 of the 1,295 real spellings. The four it does not (COMPOSE_EXCEPTIONS):
- র্ত্রী, র্ত্রে, র্দ্র: Kaggle labels them like র্তী, র্তে, র্দ (root ত/দ with reph) although
  they also carry a ra-phala, which no label records (the 3 triples with two spellings).
- র্যো: labelled root র + ya-phala + ো, but written without the ZWJ that its sibling র‍্যা has;
  without ZWJ every font draws a reph on য, so `compose` writes র‍্যো.
"""
import collections
import csv
import os

import numpy as np

from bengrapheme.grapheme import kaggle

GRAPHEMES_CSV = os.path.join(os.path.dirname(__file__), 'graphemes.csv')
NUM_GRAPHEMES = 1295
VIRAMA = '\u09cd'
ZWJ = '\u200d'
RA = '\u09b0'
NONE_LABEL = '0'  # Kaggle's class_map writes "no diacritic" (label 0) as the string '0'
COMPOSE_EXCEPTIONS = ('র্ত্রী', 'র্ত্রে', 'র্দ্র', 'র্যো')
# Roots that are signs, not letters: they stand alone (ং anusvara, ঃ visarga, ৎ khanda ta).
SIGN_ROOTS = ('ং', 'ঃ', 'ৎ')
# Nukta letters occur only after a vowel and form no conjuncts: no reph or phala on them.
NUKTA_ROOTS = ('ড়', 'ঢ়', 'য়')
INDEPENDENT_VOWELS = tuple('অআইঈউঊঋএঐওঔ')


def _read_graphemes(path):
  expected = ['grapheme_root', 'vowel_diacritic', 'consonant_diacritic', 'grapheme']
  with open(path, encoding='utf-8', newline='') as f:
    rows = list(csv.reader(f))
  if not rows or rows[0] != expected:
    raise ValueError(f'{path}: expected header {",".join(expected)}, got {rows[:1]}')
  graphemes = []
  for line, row in enumerate(rows[1:], start=2):
    if len(row) != 4:
      raise ValueError(f'{path} line {line}: expected 4 fields, got {len(row)}: {row}')
    labels = []
    for field, value, num in zip(expected, row, kaggle.NUM_CLASSES):
      if not value.isdigit() or int(value) >= num:
        raise ValueError(f'{path} line {line}: {field} must be an integer in 0..{num - 1}, '
                         f'got {value!r}')
      labels.append(int(value))
    if not row[3]:
      raise ValueError(f'{path} line {line}: empty grapheme')
    graphemes.append((*labels, row[3]))
  if len(graphemes) != NUM_GRAPHEMES:
    raise ValueError(f'{path}: expected {NUM_GRAPHEMES} graphemes, got {len(graphemes)}')
  return graphemes


def _most_common(values, what):
  """The spelling most rows agree on: a few real graphemes carry extra marks that their labels
  do not record (see COMPOSE_EXCEPTIONS), so unanimity is too strict."""
  if not values:
    raise ValueError(f'{GRAPHEMES_CSV}: no grapheme shows the spelling of {what}')
  return collections.Counter(values).most_common(1)[0][0]


def _derive_class_map(graphemes):
  """Returns (roots, vowels, consonants): root strings, vowel sign strings, and for each
  consonant diacritic its (prefix, phala, sign) parts, all read off the real graphemes."""
  roots = {r: g for r, v, c, g in graphemes if v == 0 and c == 0}
  vowels = {0: ''}
  for label in range(1, kaggle.NUM_CLASSES[1]):
    tails = [g[len(roots[r]):] for r, v, c, g in graphemes
             if v == label and c == 0 and r in roots and g.startswith(roots[r])]
    vowels[label] = _most_common(tails, f'vowel_diacritic {label}')
  consonants = {0: ('', '', '')}
  for label in range(1, kaggle.NUM_CLASSES[2]):
    splits = [tuple(g.split(roots[r], 1)) for r, v, c, g in graphemes
              if v == 0 and c == label and r in roots and roots[r] in g]
    prefix, suffix = _most_common(splits, f'consonant_diacritic {label}')
    # A phala (virama + consonant) joins the root before the vowel sign; a sign (candrabindu)
    # comes after the vowel sign.
    if suffix.startswith(VIRAMA):
      consonants[label] = (prefix, suffix, '')
    else:
      consonants[label] = (prefix, '', suffix)
  # 13 roots never appear bare; strip their diacritics off the graphemes that carry them.
  for root in range(kaggle.NUM_CLASSES[0]):
    if root not in roots:
      stripped = [_strip(g, vowels[v], consonants[c]) for r, v, c, g in graphemes if r == root]
      roots[root] = _most_common(stripped, f'grapheme_root {root}')
  return ([roots[r] for r in sorted(roots)], [vowels[v] for v in sorted(vowels)],
          [consonants[c] for c in sorted(consonants)])


def _strip(grapheme, vowel, consonant):
  prefix, phala, sign = consonant
  tail = phala + vowel + sign
  if not (grapheme.startswith(prefix) and grapheme.endswith(tail)):
    raise ValueError(f'{GRAPHEMES_CSV}: grapheme {grapheme} does not have the form '
                     f'{prefix!r} + root + {tail!r}')
  return grapheme[len(prefix):len(grapheme) - len(tail)]


GRAPHEMES = _read_graphemes(GRAPHEMES_CSV)
ROOTS, VOWELS, CONSONANTS = _derive_class_map(GRAPHEMES)
_GRAPHEME_IDS = {g: i for i, (_, _, _, g) in enumerate(GRAPHEMES)}


def _consonant_string(parts):
  prefix, phala, sign = parts
  # Kaggle writes reph + ya-phala as র্য: the two parts share one virama.
  if prefix and phala:
    return prefix + phala[len(VIRAMA):]
  return prefix + phala + sign


def _class_map():
  strings = (ROOTS, [v or NONE_LABEL for v in VOWELS],
             [_consonant_string(c) or NONE_LABEL for c in CONSONANTS])
  return [(component, label, s) for component, values in zip(kaggle.COMPONENTS, strings)
          for label, s in enumerate(values)]


_CLASS_MAP = _class_map()
_COMPONENT_STRINGS = {(component, label): s for component, label, s in _CLASS_MAP}


def class_map():
  """Rows (component_type, label, component) in the order of Kaggle's class_map.csv."""
  return list(_CLASS_MAP)


def component_string(component_type, label):
  """The class map string of one component label, e.g. ('vowel_diacritic', 1) -> 'া'."""
  if (component_type, label) not in _COMPONENT_STRINGS:
    raise ValueError(f'expected a component_type in {kaggle.COMPONENTS} and a label in its '
                     f'range {kaggle.NUM_CLASSES}, got {component_type!r}, {label!r}')
  return _COMPONENT_STRINGS[component_type, label]


def grapheme_id(grapheme):
  """Whole-grapheme class id 0..1294 (row of graphemes.csv), or -1 for any other string."""
  return _GRAPHEME_IDS.get(grapheme, -1)


def compose(root, vowel, consonant):
  """The Unicode spelling of a root/vowel/consonant label triple."""
  for component, label, num in zip(kaggle.COMPONENTS, (root, vowel, consonant), kaggle.NUM_CLASSES):
    if not 0 <= label < num:
      raise ValueError(f'{component} label must be in 0..{num - 1}, got {label}')
  prefix, phala, sign = CONSONANTS[consonant]
  base = ROOTS[root]
  # RA + virama + consonant is shaped as a reph on that consonant; a ZWJ after RA keeps the
  # RA whole and draws the phala under it (র‍্য).
  if phala and base.endswith(RA):
    base += ZWJ
  return prefix + base + phala + VOWELS[vowel] + sign


def _valid(root, vowel, consonant):
  """Whether a label triple spells a grapheme Bengali writing uses.

  Signs (ং ঃ ৎ) stand alone. Independent vowels take no vowel sign, reph or phala, only a
  candrabindu. Consonants and conjuncts take any vowel sign and consonant diacritic, except:
  no reph on a root that starts with RA (র্র) or on a nukta letter (ড় ঢ় য়), and no phala on a
  nukta letter, no ra-phala on RA, and no ৃ after a phala (both hang below the same
  consonant; the real table never pairs them either).
  """
  text = ROOTS[root]
  prefix, phala, _ = CONSONANTS[consonant]
  if text in SIGN_ROOTS:
    return vowel == 0 and consonant == 0
  if text in INDEPENDENT_VOWELS:
    return vowel == 0 and not prefix and not phala
  if text in NUKTA_ROOTS:
    return not prefix and not phala
  if prefix and text.startswith(RA):
    return False
  if phala and VOWELS[vowel] == 'ৃ':
    return False
  return not (text == RA and RA in phala)


def unseen_triples():
  """Valid (root, vowel, consonant) triples that are not among the 1,292 real ones."""
  seen = {(r, v, c) for r, v, c, _ in GRAPHEMES}
  return [(r, v, c) for r in range(kaggle.NUM_CLASSES[0]) for v in range(kaggle.NUM_CLASSES[1])
          for c in range(kaggle.NUM_CLASSES[2]) if (r, v, c) not in seen and _valid(r, v, c)]


REAL_TRIPLES = frozenset((r, v, c) for r, v, c, _ in GRAPHEMES)
# The 5th place's recoding: each consonant diacritic is a set of parts, so a rare class
# (3, reph + ya-phala: 4 training graphemes) is learnt from its parts' common classes (2, 4).
CONSONANT_PART_NAMES = ('candrabindu', 'reph', 'ya_phala', 'ra_phala')


def _consonant_parts(parts):
  prefix, phala, sign = parts
  return (int(bool(sign)), int(bool(prefix)), int('য' in phala), int(phala.startswith(VIRAMA + RA)))


# [7, 4] 0/1: which parts each of the 7 Kaggle consonant classes is made of.
CONSONANT_PARTS = [_consonant_parts(c) for c in CONSONANTS]

# Each root spelt as its letters by position (ক্ষ: ক first, ষ second), the signs between them
# dropped: 79 (position, letter) slots over the 168 roots, no two roots with the same pattern.
# A root rare in training, or seen only in other graphemes, shares its letters with common
# roots (config.model.root_letters; grapheme/model.py).
def _root_letter_slots(root):
  return {(i, letter) for i, letter in enumerate(c for c in root if c not in (VIRAMA, ZWJ))}


ROOT_LETTER_SLOTS = sorted(set().union(*map(_root_letter_slots, ROOTS)))
# [168, 79] 0/1: which slots each root is made of.
ROOT_LETTERS = [[int(slot in _root_letter_slots(root)) for slot in ROOT_LETTER_SLOTS]
                for root in ROOTS]

# The March 2020 label update (Kaggle's class_map_corrected.csv, train_multi_diacritics.csv):
# consonant class 7 is reph + ra-phala together, the mark the three graphemes র্ত্রী, র্ত্রে,
# র্দ্র carry and class 2 (reph) left out. Scores and submissions stay in the competition's
# 7 classes: class 7 counts as 2, as the competition's own labels have it.
REPH_RA_PHALA = 7
CORRECTED_CONSONANTS = CONSONANTS + [('র্', VIRAMA + RA, '')]
CORRECTED_CONSONANT_PARTS = [_consonant_parts(c) for c in CORRECTED_CONSONANTS]
# The real graphemes whose corrected label is 7: reph on the root and a ra-phala under it.
MULTI_DIACRITIC_GRAPHEMES = tuple(g for _, _, c, g in GRAPHEMES
                                  if c == 2 and VIRAMA + RA in g[len(RA + VIRAMA):])


def num_classes(corrected_labels):
  """Classes per component the model learns: (168, 11, 7), or 8 consonant classes with the
  corrected labels (config.data.corrected_labels)."""
  return kaggle.NUM_CLASSES[:2] + (len(CORRECTED_CONSONANTS) if corrected_labels
                                   else kaggle.NUM_CLASSES[2],)


def consonant_parts(corrected_labels):
  """[classes, 4] 0/1 part patterns of the consonant classes the model learns."""
  return CORRECTED_CONSONANT_PARTS if corrected_labels else CONSONANT_PARTS


def to_competition(labels):
  """Labels [..., 3] in the corrected classes -> the competition's (consonant 7 -> 2)."""
  labels = np.asarray(labels)
  out = labels.copy()
  out[..., 2] = np.where(labels[..., 2] == REPH_RA_PHALA, 2, labels[..., 2])
  return out


def class_map_corrected():
  """Rows (component_type, label, component) of Kaggle's class_map_corrected.csv."""
  prefix, phala, _ = CORRECTED_CONSONANTS[REPH_RA_PHALA]
  return class_map() + [('consonant_diacritic', REPH_RA_PHALA, prefix + phala)]


def spelling(root, vowel, consonant):
  """The real table's spelling of a triple when it has one, else `compose`'s."""
  return _REAL_SPELLINGS.get((root, vowel, consonant)) or compose(root, vowel, consonant)


# The first spelling of each real triple (3 triples have two, see COMPOSE_EXCEPTIONS).
_REAL_SPELLINGS = {(r, v, c): g for r, v, c, g in reversed(GRAPHEMES)}
