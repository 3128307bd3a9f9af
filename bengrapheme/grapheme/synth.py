"""Synthetic Bengali.AI dataset in the exact Kaggle bengaliai-cv19 layout.

  python -m bengrapheme.grapheme.synth --out DATA --train 20000 --test 4000 --seed 0

writes train.csv, train_image_data_{0..3}.parquet, test.csv, test_image_data_{0..3}.parquet,
sample_submission.csv, class_map.csv, the test answers in test_labels.csv
(image_id,grapheme_root,vowel_diacritic,consonant_diacritic,grapheme,seen,font), and the
March 2020 label update as Kaggle added it: class_map_corrected.csv (consonant class 7, reph +
ra-phala) and train_multi_diacritics.csv (train.csv's rows of the three graphemes that carry
both, relabelled 7).

Each image is a grapheme drawn in a Bengali font, then warped to look handwritten: random
size, position, rotation, shear and aspect, elastic wobble, stroke width or a monoline pen
along the strokes' centre lines, pen breaks, uneven ink, blur, paper shading and noise. Train
cycles through the 1,295 real graphemes in shuffled rounds, so each appears once per 1,295
images. Test mixes real graphemes with unseen ones
(`classes.unseen_triples`, fraction `unseen_fraction`) and draws half of its images in fonts
that train never uses (HELD_OUT_FONTS), as the real private test had new graphemes and writers.

Labels and fonts are planned from (seed, split); every image is drawn from its own generator
seeded by (seed, split, index), so the output does not depend on the worker count.
"""
import argparse
import contextlib
import csv
import functools
import os
import re

import numpy as np
import scipy.ndimage
import skimage.morphology
from PIL import Image, ImageDraw, ImageFont

from bengrapheme import console, errors, files
from bengrapheme.grapheme import classes
from bengrapheme.grapheme import kaggle

FONT_DIR = '/usr/share/fonts/truetype'  # the Debian font packages
# Google Fonts' Bengali families, from the npm registry (fonts/package.json; `make fonts`);
# another folder holding the same files (@expo-google-fonts/...) may be named instead.
GOOGLE_FONT_DIR = os.environ.get(
    'BENGRAPHEME_GOOGLE_FONTS',
    os.path.join(os.path.dirname(__file__), '..', '..', 'fonts', 'node_modules',
                 '@expo-google-fonts'))


def debian_font(path):
  return os.path.join(FONT_DIR, path)


def google_font(path):
  return os.path.normpath(os.path.join(GOOGLE_FONT_DIR, path))


# Fonts whose Bengali shaping was checked by eye (reph, phalas, conjuncts, vowel signs).
# Left out: MitraMono, FreeSans(Oblique), FreeSerif(Italic) draw ra-/ya-phala with an
# explicit virama (ত্‌র, ঘ্‌য) which no writer does; Ani mangles some conjuncts (জ্ঞ, ক্ষ্ণ).
# The Google families widen the designs training sees (the validation family of synth_val.py
# measured the gain, docs/graphemes.md): calligraphic (Galada), rounded hand-lettered (Atma),
# geometric (Mina), and several weights of each, for the stroke widths of different pens.
TRAIN_FONTS = {
    'Likhan': debian_font('fonts-beng-extra/LikhanNormal.ttf'),
    'Mukti': debian_font('fonts-beng-extra/Mukti.ttf'),
    'Mukti Bold': debian_font('fonts-beng-extra/Muktibold.ttf'),
    'Noto Sans Bengali': debian_font('noto/NotoSansBengali-Regular.ttf'),
    'Noto Sans Bengali Bold': debian_font('noto/NotoSansBengali-Bold.ttf'),
    'Noto Serif Bengali': debian_font('noto/NotoSerifBengali-Regular.ttf'),
    'Noto Serif Bengali Bold': debian_font('noto/NotoSerifBengali-Bold.ttf'),
    'Noto Sans Bengali Thin': google_font('noto-sans-bengali/100Thin/NotoSansBengali_100Thin.ttf'),
    'Noto Sans Bengali Black':
        google_font('noto-sans-bengali/900Black/NotoSansBengali_900Black.ttf'),
    'Noto Serif Bengali ExtraLight':
        google_font('noto-serif-bengali/200ExtraLight/NotoSerifBengali_200ExtraLight.ttf'),
    'Noto Serif Bengali Black':
        google_font('noto-serif-bengali/900Black/NotoSerifBengali_900Black.ttf'),
    'Galada': google_font('galada/Galada_400Regular.ttf'),
    'Atma Light': google_font('atma/Atma_300Light.ttf'),
    'Atma Bold': google_font('atma/Atma_700Bold.ttf'),
    'Hind Siliguri Light': google_font('hind-siliguri/300Light/HindSiliguri_300Light.ttf'),
    'Hind Siliguri Bold': google_font('hind-siliguri/700Bold/HindSiliguri_700Bold.ttf'),
    'Mina': google_font('mina/400Regular/Mina_400Regular.ttf'),
    'Mina Bold': google_font('mina/700Bold/Mina_700Bold.ttf'),
    'Baloo Da 2': google_font('baloo-da-2/BalooDa2_400Regular.ttf'),
    'Baloo Da 2 ExtraBold': google_font('baloo-da-2/BalooDa2_800ExtraBold.ttf'),
}
# Test-only fonts: two designs unlike the train ones, standing in for unseen writers.
HELD_OUT_FONTS = {
    'Jamrul': debian_font('fonts-beng-extra/JamrulNormal.ttf'),
    'Lohit Bengali': debian_font('lohit-bengali/Lohit-Bengali.ttf'),
}
FONTS = {**TRAIN_FONTS, **HELD_OUT_FONTS}
MISSING_FONT_HELP = ('`make fonts` installs them: the Debian packages fonts-beng fonts-beng-extra '
                     'fonts-lohit-beng-bengali fonts-noto-core, and fonts/package.json from npm')
HELD_OUT_FONT_FRACTION = 0.5  # of test images
FONT_SIZE = 96  # px; drawn once, then scaled to the frame
SPLIT_CODES = {'train': 0, 'test': 1}
NBSP = '\u00a0'
# Text drawn for a grapheme where its own spelling draws wrong. Drawn without ZWJ, র্যো gets a
# reph on য in every font, contradicting its label (root র + ya-phala): use the ZWJ spelling of
# its sibling র‍্যা. A lone ং or ঃ is a mark without a base, which HarfBuzz draws on a dotted
# circle; a no-break space is the invisible base Unicode recommends.
RENDER_SPELLING = {'র্যো': classes.compose(123, 9, 4), 'ং': NBSP + 'ং', 'ঃ': NBSP + 'ঃ'}
# Shaping faults found by shaping every real and unseen grapheme in every font with HarfBuzz
# (uharfbuzz, used once offline) and looking at the flagged ones: Likhan and Jamrul draw a ba- or
# ra-phala as a full letter when a ya-phala and ু/ূ follow it (দ্ব্যু comes out as দবু্য).
# Other fonts fall back to a visible virama for a few rare conjuncts (ফ্‌ফ, ঙ্‌ক্র): a legitimate
# Bengali spelling, kept.
SHAPING_FAULTS = {'Likhan': re.compile('্[বর]্য[ুূ]'), 'Jamrul': re.compile('্[বর]্য[ুূ]')}


# ----------------------------------------------------------------------------- fonts

@functools.cache
def _font(name):
  path = FONTS[name]
  if not os.path.exists(path):
    raise FileNotFoundError(f'font {name!r}: {path} not found; {MISSING_FONT_HELP}')
  return ImageFont.truetype(path, FONT_SIZE, layout_engine=ImageFont.Layout.RAQM)


def _glyph_mask(font, char):
  mask = font.getmask(char)
  return mask.size, bytes(mask)


@functools.cache
def _missing_chars(path):
  """The characters we draw (class map strings, render spellings) that the font file lacks.

  Pillow draws a missing glyph as the font's .notdef box; U+FFFF is a noncharacter no font
  maps, so a character drawn exactly like it is missing.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f'font {path} not found; {MISSING_FONT_HELP}')
  font = ImageFont.truetype(path, 48, layout_engine=ImageFont.Layout.BASIC)
  notdef = _glyph_mask(font, '\uffff')
  strings = classes.ROOTS + classes.VOWELS + [''.join(c) for c in classes.CONSONANTS]
  strings += list(RENDER_SPELLING.values())
  chars = set(''.join(strings)) - {classes.ZWJ}  # ZWJ is invisible by design
  return frozenset(c for c in chars if _glyph_mask(font, c) == notdef)


def _draws(font_name, text, pool=FONTS):
  """Whether the font (pool[font_name], a file) has every glyph of the text and shapes it
  without a known fault."""
  fault = SHAPING_FAULTS.get(font_name)
  return not _missing_chars(pool[font_name]) & set(text) and not (fault and fault.search(text))


def pick_font(rng, pool, text):
  """A font of pool ({name: file}) that draws the text."""
  fonts = [f for f in pool if _draws(f, text, pool)]
  if not fonts:
    raise ValueError(f'no font in {sorted(pool)} draws {text!r} (missing glyphs or a known '
                     'shaping fault)')
  return fonts[rng.integers(len(fonts))]


# ----------------------------------------------------------------------------- plan

def cycle(rng, n, size):
  """`size` draws from range(n): shuffled rounds of all n, so every value appears equally."""
  rounds = -(-size // n)
  return np.array([rng.permutation(n) for _ in range(rounds)], int).reshape(-1)[:size]


def _spread(rng, size, fraction):
  """A shuffled boolean array with exactly round(size * fraction) True."""
  flags = np.arange(size) < round(size * fraction)
  return rng.permutation(flags)


def _plan(split, num, seed, unseen_fraction):
  """Rows (image_id, root, vowel, consonant, grapheme, text to draw, font, seen)."""
  rng = np.random.default_rng([seed, SPLIT_CODES[split]])
  prefix = split.capitalize()
  if split == 'train':
    seen = np.ones(num, bool)
    held_out = np.zeros(num, bool)
  else:
    seen = ~_spread(rng, num, unseen_fraction)
    held_out = _spread(rng, num, HELD_OUT_FONT_FRACTION)
  return plan_rows(rng, prefix, seen,
                   [HELD_OUT_FONTS if h else TRAIN_FONTS for h in held_out])


def plan_rows(rng, prefix, seen, font_pools):
  """Rows (image_id, root, vowel, consonant, grapheme, text to draw, font, seen): seen[i]
  picks a real grapheme (in shuffled rounds of the 1,295) or an unseen one (in rounds of
  classes.unseen_triples()), drawn in a font of font_pools[i] that draws it."""
  real = iter(cycle(rng, classes.NUM_GRAPHEMES, int(seen.sum())))
  unseen = classes.unseen_triples()
  new = iter(cycle(rng, len(unseen), int((~seen).sum())))
  rows = []
  for i, pool in enumerate(font_pools):
    if seen[i]:
      root, vowel, consonant, grapheme = classes.GRAPHEMES[next(real)]
    else:
      root, vowel, consonant = unseen[next(new)]
      grapheme = classes.compose(root, vowel, consonant)
    text = RENDER_SPELLING.get(grapheme, grapheme)
    font = pick_font(rng, pool, text)
    rows.append((f'{prefix}_{i}', root, vowel, consonant, grapheme, text, font, bool(seen[i])))
  return rows


# ----------------------------------------------------------------------------- drawing

def _draw_text(text, font_name):
  """The text as an 'L' image cropped to its ink: 255 = ink, 0 = background."""
  font = _font(font_name)
  left, top, right, bottom = font.getbbox(text)
  pad = 4
  canvas = Image.new('L', (right - left + 2 * pad, bottom - top + 2 * pad), 0)
  ImageDraw.Draw(canvas).text((pad - left, pad - top), text, font=font, fill=255)
  bbox = canvas.getbbox()
  if bbox is None:
    raise ValueError(f'font {font_name!r} draws nothing for {text!r}')
  return canvas.crop(bbox)


def _place(glyph, rng):
  """Affine-warps the glyph into the 137x236 frame: rotation, shear, aspect, size, position."""
  w, h = glyph.size
  angle = np.deg2rad(np.clip(rng.normal(0, 5), -15, 15))
  shear = np.clip(rng.normal(0, 0.12), -0.3, 0.3)
  aspect = np.exp(np.clip(rng.normal(0, 0.12), -0.3, 0.3))
  rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
  mat = rot @ np.array([[1, shear], [0, 1]]) @ np.diag([aspect, 1 / aspect])
  corners = mat @ np.array([[-w, w, w, -w], [-h, -h, h, h]]) / 2
  extent = corners.max(axis=1) - corners.min(axis=1)
  # Real images: the grapheme fills roughly half to nearly all of the frame height. The margin
  # keeps strokes inside the frame after the elastic wobble and thickening move them.
  margin = 8
  room = np.array([kaggle.WIDTH, kaggle.HEIGHT]) - 2 * margin
  scale = min(rng.uniform(0.6, 1) * room[1] / extent[1], room[0] / extent[0])
  mat = scale * mat
  slack = room - scale * extent
  # Mostly near the centre, sometimes pushed towards an edge.
  centre = np.array([kaggle.WIDTH, kaggle.HEIGHT]) / 2
  centre += np.clip(rng.normal(0, 0.4, 2), -1, 1) * slack / 2
  inv = np.linalg.inv(mat)
  offset = np.array([w, h]) / 2 - inv @ centre
  coeffs = (inv[0, 0], inv[0, 1], offset[0], inv[1, 0], inv[1, 1], offset[1])
  frame = glyph.transform((kaggle.WIDTH, kaggle.HEIGHT), Image.AFFINE, coeffs, Image.BILINEAR)
  return np.asarray(frame, np.float32) / 255


def _smooth_field(rng, cells):
  """A smooth random field over the frame in [-1, 1]: noise on a coarse grid, upsampled."""
  rows = max(2, round(kaggle.HEIGHT / cells))
  cols = max(2, round(kaggle.WIDTH / cells))
  coarse = Image.fromarray(rng.uniform(-1, 1, (rows, cols)).astype(np.float32), 'F')
  return np.asarray(coarse.resize((kaggle.WIDTH, kaggle.HEIGHT), Image.BICUBIC))


_GRID = np.mgrid[:kaggle.HEIGHT, :kaggle.WIDTH].astype(np.float32)


def _elastic(ink, rng):
  """Wobbles the strokes: a large slow displacement plus a small fast one, as a hand does.
  The slow one reaches ~9 px: a hand bends a letter's shape that far, and models trained on
  milder warps lost most on warped graphemes of the validation family (docs/graphemes.md)."""
  dy = _smooth_field(rng, 48) * rng.uniform(0, 9) + _smooth_field(rng, 14) * rng.uniform(0, 1.5)
  dx = _smooth_field(rng, 48) * rng.uniform(0, 9) + _smooth_field(rng, 14) * rng.uniform(0, 1.5)
  return scipy.ndimage.map_coordinates(ink, _GRID + np.stack([dy, dx]), order=1, mode='constant')


def _disk(radius):
  yy, xx = np.mgrid[-radius:radius + 1, -radius:radius + 1]
  return xx ** 2 + yy ** 2 <= radius ** 2 + 0.5


def _monoline(ink, rng):
  """A pen of one width along the strokes' centre lines, as a marker or a ballpoint writes
  (the real Bengali.AI images), instead of the font's thick-and-thin strokes."""
  centre = skimage.morphology.skeletonize(ink > 0.5)
  if not centre.any():
    return ink
  distance = scipy.ndimage.distance_transform_edt(~centre)
  return np.clip(rng.uniform(1.0, 4.0) + 0.5 - distance, 0, 1).astype(np.float32)


def _breaks(ink, rng):
  """Half the images get a few short gaps where the pen skipped."""
  if rng.random() < 0.5:
    return ink
  return ink * (_smooth_field(rng, 6) < rng.uniform(0.6, 0.95))


def _stroke(ink, rng):
  """Pen width: the fonts' strokes are thinner and more even than marker handwriting."""
  radius = rng.choice([-1, 0, 1, 1, 2, 2, 3])  # -1: thinner, for the bold fonts' sake
  if radius > 0:
    return scipy.ndimage.grey_dilation(ink, footprint=_disk(radius))
  if radius < 0:
    return scipy.ndimage.grey_erosion(ink, footprint=_disk(1))
  return ink


def _ink_and_paper(ink, rng):
  """Turns ink coverage into grey levels: uneven pressure, contrast, blur, shading, noise."""
  ink = ink * (1 - rng.uniform(0, 0.7) * (_smooth_field(rng, 30) + 1) / 2)
  ink = scipy.ndimage.gaussian_filter(ink, rng.uniform(0.2, 1.0))
  paper = rng.uniform(225, 255) + _smooth_field(rng, 80) * rng.uniform(0, 10)
  dark = rng.uniform(0, 90)
  image = paper + (dark - paper) * np.clip(ink, 0, 1)
  image += rng.normal(0, rng.uniform(0, 10), image.shape)
  return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def render(text, font_name, seed):
  """One 137x236 uint8 image (0 = ink, 255 = paper) of the text, warped by seed's randomness."""
  rng = np.random.default_rng(seed)
  ink = _place(_draw_text(text, font_name), rng)
  ink = _elastic(ink, rng)
  # A monoline pen for 40 % of images: the modulated strokes of fonts are what handwriting
  # most often lacks.
  ink = _monoline(ink, rng) if rng.random() < 0.4 else _stroke(ink, rng)
  ink = _breaks(ink, rng)
  return _ink_and_paper(ink, rng)


def render_job(job):
  """(text, font name, seed) -> render(...): a picklable job for parallel_map."""
  text, font_name, seed = job
  return render(text, font_name, seed)


# ----------------------------------------------------------------------------- files

def _write_csv(path, header, rows):
  with open(path, 'w', encoding='utf-8', newline='') as f:
    writer = csv.writer(f, lineterminator='\n')
    writer.writerow(header)
    writer.writerows(rows)


def write_images(out_dir, split, plan, seed, code, imap, progress, job=render_job):
  """Draws the split's images shard by shard, so memory holds a quarter of it at a time:
  image i is job((text, font, [seed, code, i]))."""
  for shard, indices in enumerate(np.array_split(np.arange(len(plan)), kaggle.NUM_SHARDS)):
    jobs = [(plan[i][5], plan[i][6], [seed, code, int(i)]) for i in indices]
    images = np.zeros((len(jobs), kaggle.HEIGHT, kaggle.WIDTH), np.uint8)
    for k, image in enumerate(imap(job, jobs)):
      images[k] = image
      progress.update()
    path = os.path.join(out_dir, kaggle.image_parquet_name(split, shard))
    kaggle.write_image_parquet(path, [plan[i][0] for i in indices], images)


def write_tables(out_dir, train, test):
  _write_csv(os.path.join(out_dir, 'train.csv'),
             ['image_id', *kaggle.COMPONENTS, 'grapheme'], [row[:5] for row in train])
  # The March 2020 update: the train rows of reph + ra-phala graphemes, consonant class 7.
  _write_csv(os.path.join(out_dir, kaggle.CLASS_MAP_CORRECTED), kaggle.CLASS_MAP_COLUMNS,
             classes.class_map_corrected())
  _write_csv(os.path.join(out_dir, kaggle.MULTI_DIACRITICS), kaggle.LABEL_COLUMNS,
             [(row[0], row[1], row[2], classes.REPH_RA_PHALA, row[4]) for row in train
              if row[4] in classes.MULTI_DIACRITIC_GRAPHEMES])
  write_test_tables(out_dir, test)


def write_test_tables(out_dir, test):
  """test.csv, sample_submission.csv, class_map.csv and the answers, test_labels.csv, of the
  test rows (image_id, root, vowel, consonant, grapheme, text, font, seen)."""
  components = sorted(kaggle.COMPONENTS)  # Kaggle lists an image's rows alphabetically
  row_ids = [(f'{row[0]}_{c}', row[0], c) for row in test for c in components]
  _write_csv(os.path.join(out_dir, 'test.csv'), ['row_id', 'image_id', 'component'], row_ids)
  _write_csv(os.path.join(out_dir, 'sample_submission.csv'), ['row_id', 'target'],
             [(row_id, 0) for row_id, _, _ in row_ids])
  _write_csv(os.path.join(out_dir, 'class_map.csv'), kaggle.CLASS_MAP_COLUMNS,
             classes.class_map())
  _write_csv(os.path.join(out_dir, 'test_labels.csv'),
             ['image_id', *kaggle.COMPONENTS, 'grapheme', 'seen', 'font'],
             [(*row[:5], int(row[7]), row[6]) for row in test])


def write_dataset(out_dir, num_train, num_test, seed=0, workers=None, unseen_fraction=0.3):
  """Writes a synthetic dataset in the Kaggle bengaliai-cv19 layout into out_dir."""
  for name, value in (('num_train', num_train), ('num_test', num_test), ('seed', seed)):
    if not isinstance(value, (int, np.integer)) or value < 0:
      raise ValueError(f'{name} must be a non-negative integer, got {value!r}')
  if not 0 <= unseen_fraction <= 1:
    raise ValueError(f'unseen_fraction must be in [0, 1], got {unseen_fraction}')
  if workers is not None and workers < 1:
    raise ValueError(f'workers must be at least 1, got {workers}')
  workers = workers or len(os.sched_getaffinity(0))
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise errors.NotEmpty(f'{out_dir} is not empty; choose a new --out (nothing was written)')
  # Everything goes to a temporary folder renamed into place at the end: an interrupted run
  # never leaves a dataset that looks complete. Not fsynced file by file: a rerun rebuilds it.
  with errors.on_ctrl_c(f'Interrupted (Ctrl-C) while writing {out_dir}: nothing was left '
                        'there; rerun to write it.'), \
      files.atomic_dir(out_dir, durable=False) as tmp:
    out_dir = str(tmp)
    train = _plan('train', num_train, seed, unseen_fraction)
    test = _plan('test', num_test, seed, unseen_fraction)
    write_tables(out_dir, train, test)
    with console.Progress(num_train + num_test, 'drawing graphemes', unit='image') as progress, \
        parallel_map(workers) as imap:
      write_images(out_dir, 'train', train, seed, SPLIT_CODES['train'], imap, progress)
      write_images(out_dir, 'test', test, seed, SPLIT_CODES['test'], imap, progress)


@contextlib.contextmanager
def parallel_map(workers):
  """An ordered, lazy map over `workers` processes (1: this process), for render_job."""
  if workers == 1:
    yield map
    return
  # Not fork: the caller may run threads (JAX, pyarrow) whose locks a fork would copy.
  with console.worker_pool(workers, 'forkserver') as pool:
    yield functools.partial(pool.imap, chunksize=16)


def arguments(doc, counts, unseen_fraction, more=None):
  """The generators' command line: --out, an image count per {flag: help}, --seed,
  --workers, --unseen-fraction (default `unseen_fraction`) and {flag: add_argument's keywords}
  of `more`."""
  parser = argparse.ArgumentParser(description=doc.split('\n\n')[0])
  parser.add_argument('--out', required=True, help='output folder')
  for flag, text in counts.items():
    parser.add_argument(flag, type=int, required=True, help=text)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--workers', type=int, default=None, help='default: all usable cores')
  parser.add_argument('--unseen-fraction', type=float, default=unseen_fraction,
                      help='fraction of test images showing graphemes not in the real table')
  for flag, keywords in (more or {}).items():
    parser.add_argument(flag, **keywords)
  return parser.parse_args()


def main():
  args = arguments(__doc__, {'--train': 'number of train images',
                             '--test': 'number of test images'}, 0.3)
  write_dataset(args.out, args.train, args.test, args.seed, args.workers, args.unseen_fraction)


if __name__ == '__main__':
  errors.run_reporting(main)
