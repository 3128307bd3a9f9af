"""Synthetic historical writers and pages, cut into fragments in the HisFrag20 layout.

A writer is one handwriting or historical font plus a style drawn once: letter height, slant,
stroke weight, letter, word and line spacing, baseline wobble, ink colour and margins.
Consecutive writers share a font in groups of WRITERS_PER_HAND, as scribes trained in one hand
do, so that telling writers apart takes more than telling fonts apart. A page varies its
writer's habits as real pages do (another day, pen, ink and paper stock: see page_style) and
is the writer's pseudo-Latin text on textured paper with stains, fading and bleed-through,
cut by retrieval.synthetic.fragments. Train and test writers are disjoint:

  OUT/train/WID_PID_FID.jpg   writers 1..N
  OUT/test/WID_PID_FID.jpg    writers N+1..N+M

Every page depends only on (seed, writer, page), so the output does not depend on --workers.

  python -m retrieval.synthetic.synth --out /tmp/hisfrag --writers-train 40 --writers-test 20 \
      --pages-per-writer 4 --seed 0 --workers 2
"""
import argparse
import functools
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from bengrapheme import errors, files
from retrieval.synthetic import fragments

FONT_ROOT = '/usr/share/fonts'
# (Debian package, font file under FONT_ROOT): handwriting, secretary hand, blackletter and
# early roman type. Zainer-Initials is left out: it has capitals only.
FONTS = (
    ('fonts-dkg-handwriting', 'truetype/fifthhorseman/dkg.ttf'),
    ('fonts-dkg-handwriting', 'truetype/fifthhorseman/dkgIt.ttf'),
    ('fonts-breip', 'truetype/breip/Breip.ttf'),
    ('fonts-sjfonts', 'truetype/sjfonts/Delphine.ttf'),
    ('fonts-sjfonts', 'truetype/sjfonts/SteveHand.ttf'),
    ('fonts-rufscript', 'truetype/rufscript/Rufscript010.ttf'),
    ('fonts-kristi', 'truetype/kristi/Kristi.ttf'),
    ('fonts-dancingscript', 'opentype/dancingscript/DancingScript-Regular.otf'),
    ('fonts-kaushanscript', 'opentype/kaushanscript/KaushanScript-Regular.otf'),
    ('fonts-ecolier-court', 'truetype/ecolier-court/Ecolier-court.ttf'),
    ('fonts-tlwg-purisa-ttf', 'truetype/tlwg/Purisa.ttf'),
    ('fonts-tlwg-purisa-ttf', 'truetype/tlwg/Purisa-Oblique.ttf'),
    ('fonts-comic-neue', 'opentype/comic-neue/ComicNeue-Regular.otf'),
    ('fonts-comic-neue', 'opentype/comic-neue/ComicNeue-Italic.otf'),
    ('fonts-joscelyn', 'opentype/joscelyn/Joscelyn-Regular.otf'),
    ('fonts-isabella', 'truetype/isabella/Isabella.ttf'),
    ('fonts-blankenburg', 'truetype/blankenburg/Blankenburg_UNZ1A.ttf'),
    ('fonts-gotico-antiqua',
     'opentype/gotico-antiqua/Fust&Schoeffer-Durandus-GoticoAntiqua118G.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Hamlet-Cicero12.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Hamlet-Tertia18.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Jessen-Cicero12.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Jessen-Mittel14.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Parix-Hybrid111R.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Ptolemy-GreatPrimer18.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Rot-ProtoRoman102R.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Rusch-GoticoAntiqua100G.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Rusch-R-Bizarre-ProtoRoman103R.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/SouffletVert-Hybrid106R.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Spira-ProtoRoman110R.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Sweynheim&Pannartz-ProtoRoman115R.otf'),
    ('fonts-gotico-antiqua',
     'opentype/gotico-antiqua/Sweynheim&Pannartz-Subiaco-ProtoRoman120R.otf'),
    ('fonts-gotico-antiqua', 'opentype/gotico-antiqua/Zainer-GoticoAntiqua96G.otf'),
    ('fonts-junicode', 'opentype/junicode/JunicodeTwoBeta-Regular.otf'),
    ('fonts-junicode', 'opentype/junicode/JunicodeTwoBeta-Italic.otf'),
    ('fonts-elstob', 'opentype/elstob/ElstobD-Regular.otf'),
    ('fonts-elstob', 'opentype/elstob/ElstobD-Italic.otf'),
    ('fonts-cardo', 'truetype/cardo/Cardo104s.ttf'),
    ('fonts-cardo', 'truetype/cardo/Cardoi99.ttf'),
    ('fonts-klaudia-berenika', 'truetype/klaudia-berenika/Berenika.ttf'),
    ('fonts-klaudia-berenika', 'truetype/klaudia-berenika/Klaudia.ttf'),
    ('fonts-klaudia-berenika', 'truetype/klaudia-berenika/Klaudia-Oblique.ttf'),
)
WRITERS_PER_HAND = 6  # writers sharing one font (with their own styles)
LETTERS = 'abcdefghijklmnopqrstuvwxyz'
CAPITALS = 'ABCDEFGHILMNOPQRSTV'  # the capitals of the classical Latin alphabet in use here
PUNCTUATION = '.,;:'

# Pseudo-Latin syllables: (text, weight).
ONSETS = (('', 6), ('b', 2), ('c', 3), ('d', 3), ('f', 1), ('g', 1), ('h', 1), ('l', 3),
          ('m', 3), ('n', 3), ('p', 3), ('qu', 2), ('r', 3), ('s', 3), ('t', 4), ('v', 2),
          ('pr', 1), ('tr', 1), ('st', 1), ('sc', 1), ('gr', 1), ('cr', 1), ('fl', 1))
NUCLEI = (('a', 6), ('e', 6), ('i', 6), ('o', 4), ('u', 4), ('ae', 1), ('ia', 1), ('io', 1),
          ('ui', 1), ('au', 1))
CODAS = (('', 10), ('m', 2), ('n', 2), ('s', 3), ('t', 2), ('r', 1), ('x', 1), ('nt', 1),
         ('st', 1), ('ns', 1))

# Ink and paper colours (RGB) around which writers and pages vary.
INKS = ((62, 40, 26), (38, 32, 28), (92, 62, 36), (48, 44, 62), (110, 76, 44), (70, 30, 24))
PAPERS = ((226, 208, 170), (236, 226, 200), (214, 190, 142), (205, 198, 180), (222, 200, 160),
          (196, 176, 140))


def font_path(relative):
  return os.path.join(FONT_ROOT, relative)


def check_fonts():
  """Fails naming every missing font file and its Debian package."""
  missing = [(package, font_path(name)) for package, name in FONTS
             if not os.path.exists(font_path(name))]
  if missing:
    packages = ' '.join(sorted({package for package, _ in missing}))
    files = ', '.join(path for _, path in missing)
    raise FileNotFoundError(f'missing fonts {files}; install them with: '
                            f'apt-get install -y {packages}')


def _render(font, text):
  image = Image.new('L', (4 * font.size, 3 * font.size))
  ImageDraw.Draw(image).text((font.size, font.size), text, font=font, fill=255)
  return np.asarray(image)


@functools.lru_cache(maxsize=None)
def font_alphabet(relative):
  """The characters this generator draws that the font has real glyphs for.

  A missing glyph renders either as nothing or as the font's .notdef box, the same box as
  a private-use code point, so both are detected by comparing renderings.
  """
  font = ImageFont.truetype(font_path(relative), 40)
  notdef = [_render(font, c) for c in ('\ue000', '\u0378')]
  alphabet = ''.join(
      c for c in LETTERS + CAPITALS + PUNCTUATION
      if _render(font, c).any() and not any(np.array_equal(_render(font, c), box)
                                            for box in notdef))
  if not set(LETTERS) <= set(alphabet):
    raise ValueError(f'{font_path(relative)}: lacks the lowercase letters '
                     f'{sorted(set(LETTERS) - set(alphabet))}')
  return alphabet


@functools.lru_cache(maxsize=None)
def _x_height_ratio(relative):
  """Height of 'x' per pixel of font size, so that writers are sized by x-height."""
  font = ImageFont.truetype(font_path(relative), 100)
  top, bottom = font.getbbox('x', anchor='ls')[1::2]
  return (bottom - top) / 100


@functools.lru_cache(maxsize=64)
def _font(relative, size):
  return ImageFont.truetype(font_path(relative), size)


def writer_font(seed, writer, fonts=FONTS, writers_per_hand=WRITERS_PER_HAND):
  """The font (relative path) of a writer: each group of writers_per_hand consecutive writers
  takes the next font of a seeded order, so each font is used about equally and the test
  writers (the last ones) mostly write hands the train split lacks."""
  order = np.random.default_rng(seed).permutation(len(fonts))
  return fonts[order[(writer - 1) // writers_per_hand % len(fonts)]][1]


def writer_style(seed, writer, fonts=FONTS, writers_per_hand=WRITERS_PER_HAND):
  """The style of one writer: drawn once, from (seed, writer) only; fonts and
  writers_per_hand as writer_font's (retrieval/synthetic/synth_val.py draws from other fonts)."""
  rng = np.random.default_rng([seed, writer])
  relative = writer_font(seed, writer, fonts, writers_per_hand)
  x_height = rng.uniform(9, 17)
  size = max(8, int(round(x_height / _x_height_ratio(relative))))
  ink = np.clip(np.array(INKS[rng.integers(len(INKS))]) + rng.normal(0, 10, 3), 0, 255)
  return dict(
      font=relative, size=size, x_height=x_height,
      slant=rng.normal(0.05, 0.15),  # shear: x moves by slant * height above the baseline
      # Pen weight: a stroke outline in pixels, kept thin on small letters so they stay open.
      stroke=int(rng.integers(0, 3 if x_height > 15 else 2 if x_height > 11 else 1)),
      tracking=rng.uniform(-0.05, 0.2) * x_height,
      word_gap=rng.uniform(0.7, 1.8) * x_height,
      line_gap=rng.uniform(2.6, 4.0) * x_height,
      wobble=rng.uniform(0, 0.3) * x_height,  # baseline wave amplitude
      wobble_period=rng.uniform(150, 600),
      line_slope=rng.normal(0, 0.006),
      jitter=rng.uniform(0, 0.08) * x_height,  # per-letter baseline noise
      ink=ink, ink_opacity=rng.uniform(0.8, 0.97),
      margins=rng.uniform([50, 50, 40, 50], [130, 150, 110, 140]),  # top, left, right, bottom
  )


def page_style(style, rng):
  """The writer's style as it shows on one page: the habits stay, the day and tools change.

  Letter size, pen weight, slant and spacing drift from page to page, and each page has its
  own ink batch and paper stock, so that neither a colour nor an exact size identifies a
  writer (real pages of one scribe differ in all of these).
  """
  x_height = style['x_height'] * rng.lognormal(0, 0.12)
  size = max(8, int(round(style['size'] * x_height / style['x_height'])))
  stroke = int(np.clip(style['stroke'] + rng.choice([-1, 0, 0, 1]), 0, 2))
  if x_height <= 11:  # thin pens on small letters, so that they stay open
    stroke = min(stroke, 1)
  spacing = rng.lognormal(0, 0.10)
  ink = INKS[rng.integers(len(INKS))] if rng.uniform() < 0.5 else style['ink']
  return dict(
      style, x_height=x_height, size=size, stroke=stroke,
      slant=style['slant'] + rng.normal(0, 0.07),
      tracking=style['tracking'] * spacing, word_gap=style['word_gap'] * spacing,
      line_gap=style['line_gap'] * rng.lognormal(0, 0.08),
      wobble=style['wobble'] * rng.lognormal(0, 0.3),
      jitter=style['jitter'] * rng.lognormal(0, 0.3),
      ink=np.clip(np.array(ink, np.float64) + rng.normal(0, 8, 3), 0, 255),
      # Some pages are faint: a thin ink, a worn page.
      ink_opacity=np.clip(style['ink_opacity'] * rng.uniform(0.55, 1.05), 0.4, 0.98),
      # Scanned at its own resolution: every length on the page scales together.
      scan_scale=rng.uniform(0.7, 1.3),
      paper=np.clip(np.array(PAPERS[rng.integers(len(PAPERS))]) + rng.normal(0, 6, 3), 0, 255))


def _weighted(rng, table):
  texts, weights = zip(*table)
  cumulative = np.cumsum(weights)
  return texts[np.searchsorted(cumulative, rng.uniform(0, cumulative[-1]), side='right')]


def pseudo_latin_word(rng):
  """A lowercase word of one to four syllables (every font has all lowercase letters)."""
  syllables = [_weighted(rng, ONSETS) + _weighted(rng, NUCLEI)
               for _ in range(rng.choice([1, 2, 2, 3, 3, 4]))]
  return ''.join(syllables) + _weighted(rng, CODAS)


def _text_tokens(rng, alphabet):
  """Endless words with sentence capitals and punctuation the font has."""
  capitals = [c for c in CAPITALS if c in alphabet]
  while True:
    words = [pseudo_latin_word(rng) for _ in range(rng.integers(4, 15))]
    if capitals and rng.uniform() < 0.8:
      words[0] = capitals[rng.integers(len(capitals))] + words[0][1:]
    for i in range(len(words) - 1):
      if ',' in alphabet and rng.uniform() < 0.12:
        words[i] += ','
    stop = [c for c in '.;:' if c in alphabet]
    if stop:
      words[-1] += stop[0] if rng.uniform() < 0.8 else stop[rng.integers(len(stop))]
    yield from words


@functools.lru_cache(maxsize=8)
def _glyphs(relative, size, stroke):
  """{char: (bitmap uint8, left, top)}, offsets from the pen position on the baseline.

  Drawn once per font, size and weight: pasting cached bitmaps is many times faster than
  drawing every letter of every page.
  """
  font = _font(relative, size)
  bank = {}
  for c in font_alphabet(relative):
    left, top, right, bottom = font.getbbox(c, anchor='ls', stroke_width=stroke)
    image = Image.new('L', (right - left, bottom - top))
    ImageDraw.Draw(image).text((-left, -top), c, font=font, fill=255, anchor='ls',
                               stroke_width=stroke, stroke_fill=255)
    bank[c] = (np.asarray(image), left, top)
  return bank


def _paste_max(canvas, bitmap, top, left):
  """canvas = max(canvas, bitmap placed at (top, left)), clipped to the canvas."""
  h, w = bitmap.shape
  y0, x0 = max(top, 0), max(left, 0)
  y1, x1 = min(top + h, canvas.shape[0]), min(left + w, canvas.shape[1])
  if y1 > y0 and x1 > x0:
    region = canvas[y0:y1, x0:x1]
    np.maximum(region, bitmap[y0 - top:y1 - top, x0 - left:x1 - left], out=region)


def render_text(style, width, height, rng):
  """Ink coverage [height, width] float32 in [0, 1] of one page of the writer's text."""
  font = _font(style['font'], style['size'])
  glyphs = _glyphs(style['font'], style['size'], style['stroke'])
  ascent, descent = font.getmetrics()
  advance = {c: font.getlength(c) + style['tracking'] for c in glyphs}
  # Margins are the writer's habit on a 1000 px wide page.
  top, left, right, bottom = style['margins'] * rng.uniform(0.9, 1.1, 4) * (width / 1000)
  line_end = width - right
  # A strip holds one line: the tallest glyphs plus room for wobble, jitter and slope.
  above = max(-t for _, _, t in glyphs.values())
  below = max(b.shape[0] + t for b, _, t in glyphs.values())
  room = int(style['wobble'] + 4 * style['jitter'] + 0.015 * width) + 4
  strip_h = above + below + 2 * room
  coverage = np.zeros((height, width), np.float32)
  tokens = _text_tokens(rng, font_alphabet(style['font']))
  word = next(tokens)
  baseline = top + ascent
  while baseline + descent < height - bottom:
    strip = np.zeros((strip_h, width), np.uint8)
    x = left + (rng.uniform(1, 3) * style['x_height'] if rng.uniform() < 0.08 else 0)
    # A paragraph ends now and then with a short line.
    stop_at = line_end * (rng.uniform(0.4, 0.9) if rng.uniform() < 0.07 else 1.0)
    phase = rng.uniform(0, 2 * np.pi)
    slope = style['line_slope'] + rng.normal(0, 0.003)
    while x + sum(advance[c] for c in word) <= stop_at:
      for c in word:
        y = (room + above + slope * (x - left) + rng.normal(0, style['jitter'] + 1e-6)
             + style['wobble'] * np.sin(phase + 2 * np.pi * x / style['wobble_period']))
        bitmap, dx, dy = glyphs[c]
        _paste_max(strip, bitmap, int(round(y)) + dy, int(round(x)) + dx)
        x += advance[c]
      x += style['word_gap'] * rng.uniform(0.75, 1.3)
      word = next(tokens)
    # Shear about the baseline, so that slanted letters stay on their line.
    s = style['slant']
    sheared = Image.fromarray(strip).transform(
        (width, strip_h), Image.Transform.AFFINE, (1, s, -s * (room + above), 0, 1, 0),
        Image.Resampling.BILINEAR)
    y0 = int(round(baseline)) - room - above
    rows = slice(max(0, y0), min(height, y0 + strip_h))
    part = np.asarray(sheared, np.float32)[rows.start - y0:rows.stop - y0] / 255
    coverage[rows] = np.maximum(coverage[rows], part)
    baseline += style['line_gap'] * rng.uniform(0.96, 1.04)
  return coverage


def _smooth_field(height, width, rng, cells=4, roughness=0.9, coarse=8):
  """Fractal noise [height, width] with zero mean and unit deviation.

  Made at 1/coarse of the resolution and enlarged: the detail lost is below what shading,
  fading and stain outlines need, and it is many times faster.
  """
  small = fragments.diamond_square(max(2, height // coarse), max(2, width // coarse), cells,
                                   roughness, rng)
  small = ((small - small.mean()) / max(small.std(), 1e-9)).astype(np.float32)
  return np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR))


def _stains(height, width, rng):
  """Darkening [height, width] in [0, 1]: soft blobs with a darker rim, and foxing specks."""
  specks = Image.new('L', (width, height))
  draw = ImageDraw.Draw(specks)
  for _ in range(rng.poisson(rng.uniform(0, 30))):
    y, x, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0.8, 3)
    draw.ellipse((x - r, y - r, x + r, y + r), fill=int(rng.uniform(60, 200)))
  out = np.asarray(specks, np.float32) / 255
  for _ in range(rng.poisson(2.5)):
    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    ry, rx = rng.uniform(30, 220) * rng.uniform(0.6, 1.4, 2)
    top, left = int(max(0, cy - 1.5 * ry)), int(max(0, cx - 1.5 * rx))
    bottom, right = int(min(height, cy + 1.5 * ry)), int(min(width, cx + 1.5 * rx))
    yy, xx = np.ogrid[top:bottom, left:right]
    r = np.sqrt(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2).astype(np.float32)
    r += 0.25 * _smooth_field(bottom - top, right - left, rng, cells=3, coarse=4)
    blob = np.clip((1.0 - r) * 6, 0, 1) * rng.uniform(0.15, 0.45)
    rim = np.exp(-((r - 1.0) / 0.05) ** 2) * rng.uniform(0, 0.3)
    out[top:bottom, left:right] += blob + rim
  return np.clip(out, 0, 1)


def render_page(style, rng, width=1000, height=1400, pen=None):
  """One colour page [height, width, 3] uint8 and its text box (top, left, bottom, right).

  pen: a function of the ink coverage [height, width] float32 -> coverage, applied to the
  text and its bleed-through (retrieval/synthetic/synth_val.py's broad nib); None draws the glyphs as
  they are."""
  pen = pen or (lambda coverage: coverage)
  width = int(width * rng.uniform(0.94, 1.06))
  height = int(height * rng.uniform(0.94, 1.06))
  text = pen(render_text(style, width, height, rng))
  rows, cols = np.nonzero(text > 0.2)
  if len(rows) == 0:
    raise ValueError(f'render_page: a {width}x{height} page has no room for a line of '
                     f'{style["font"]} at x-height {style["x_height"]:.0f} px')
  text_box = (rows.min(), cols.min(), rows.max() + 1, cols.max() + 1)
  paper = (style['paper'] + rng.normal(0, 5, 3)).astype(np.float32)
  shade = 1 + 0.05 * _smooth_field(height, width, rng)
  shade += rng.normal(0, rng.uniform(0.008, 0.025), (height, width)).astype(np.float32)
  page = shade[..., None] * paper
  # Bleed-through: the verso's text, mirrored and blurred, shows faintly.
  if rng.uniform() < 0.75:
    # Blurred at half size: the same look for a quarter of the work.
    verso = Image.fromarray((pen(render_text(style, width, height, rng))[:, ::-1] * 255)
                            .astype(np.uint8)).reduce(2)
    verso = verso.filter(ImageFilter.GaussianBlur(rng.uniform(0.7, 1.7)))
    verso = np.asarray(verso.resize((width, height), Image.Resampling.BILINEAR),
                       np.float32) / 255
    alpha = (verso * rng.uniform(0.08, 0.35))[..., None]
    page += alpha * (0.5 * style['ink'].astype(np.float32) - 0.5 * page)
  page *= 1 - _stains(height, width, rng)[..., None] * np.array([0.35, 0.45, 0.65],
                                                                 np.float32)
  # Ink opacity fades in broad patches and varies with the pen's pressure along the strokes.
  fade = np.clip(1 + rng.uniform(0, 0.5) * _smooth_field(height, width, rng), 0.25, 1)
  pressure = np.clip(1 + 0.12 * _smooth_field(height, width, rng, cells=40, roughness=0.5,
                                              coarse=2), 0.6, 1)
  alpha = (text * (style['ink_opacity'] * fade * pressure))[..., None]
  ink = (style['ink'] + rng.normal(0, 6, 3)).astype(np.float32)
  page += alpha * (ink - page)
  image = Image.fromarray(np.clip(page, 1, 255).astype(np.uint8))
  image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.8)))  # scanning optics
  # The scanner's resolution: the same hand arrives at another size in pixels.
  scale = style['scan_scale']
  image = image.resize((round(width * scale), round(height * scale)), Image.Resampling.LANCZOS)
  text_box = tuple(int(round(v * scale)) for v in text_box)
  return np.asarray(image), text_box


def _page_job(job):
  out_dir, pages_dir, seed, writer, page, params, (width, height) = job
  rng = np.random.default_rng([seed, writer, page])
  image, text_box = render_page(page_style(writer_style(seed, writer), rng), rng, width,
                                height)
  if pages_dir is not None:
    Image.fromarray(image).save(os.path.join(pages_dir, f'{writer}_{page}.jpg'), quality=92)
  pieces = fragments.cut_page(image, rng, params, text_box)
  return len(fragments.save_fragments(out_dir, writer, page, pieces, params.jpeg_quality))


def write_dataset(out_dir, writers_train, writers_test, pages_per_writer, seed=0, workers=1,
                  params=None, pages_dir=None, page_size=(1000, 1400)):
  """Writes out_dir/train and out_dir/test; returns {'train': count, 'test': count}.

  Writers 1..writers_train go to train and the next writers_test to test; page ids are unique
  over the whole dataset. pages_dir, when given, also gets the uncut pages as WID_PID.jpg.
  page_size: (width, height) around which page sizes vary by +-6 %.
  """
  if min(writers_train, writers_test, pages_per_writer) < 1:
    raise ValueError(f'write_dataset: need at least one train writer, one test writer and '
                     f'one page per writer, got {writers_train}, {writers_test}, '
                     f'{pages_per_writer}')
  check_fonts()
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise errors.NotEmpty(f'{out_dir}: already holds files; expected a new or empty folder')
  # Written under a temporary name and renamed at the end: an interrupted run never leaves
  # a dataset that looks complete. Not fsynced file by file: a rerun rebuilds it.
  if pages_dir is not None:
    fragments.make_empty_dir(pages_dir)
  params = params or fragments.FragmentParams()
  kept = f' (the pages written so far stay in {pages_dir})' if pages_dir else ''
  with errors.on_ctrl_c(f'Interrupted (Ctrl-C) while writing {out_dir}: nothing was left '
                        f'there{kept}; rerun to write it.'), \
      files.atomic_dir(out_dir, durable=False) as tmp:
    jobs, splits = [], []
    for writer in range(1, writers_train + writers_test + 1):
      split = 'train' if writer <= writers_train else 'test'
      for k in range(pages_per_writer):
        page = (writer - 1) * pages_per_writer + k + 1
        jobs.append((os.path.join(tmp, split), pages_dir, seed, writer, page, params,
                     page_size))
        splits.append(split)
    for split in ('train', 'test'):
      fragments.make_empty_dir(os.path.join(tmp, split))
    counts = fragments.run_jobs(_page_job, jobs, workers, 'writing pages and fragments', 'page')
  return {split: sum(c for c, s in zip(counts, splits) if s == split)
          for split in ('train', 'test')}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', required=True)
  parser.add_argument('--writers-train', type=int, required=True)
  parser.add_argument('--writers-test', type=int, required=True)
  parser.add_argument('--pages-per-writer', type=int, required=True)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--workers', type=int, default=os.cpu_count())
  parser.add_argument('--pages-out', help='also save the uncut pages here as WID_PID.jpg')
  parser.add_argument('--page-size', type=int, nargs=2, default=(1000, 1400),
                      metavar=('WIDTH', 'HEIGHT'))
  fragments.add_param_flags(parser)
  args = parser.parse_args(argv)
  counts = write_dataset(args.out, args.writers_train, args.writers_test,
                         args.pages_per_writer, args.seed, args.workers,
                         fragments.params_from_args(args), args.pages_out, args.page_size)
  print(f'wrote {counts["train"]} train and {counts["test"]} test fragments to {args.out}')


if __name__ == '__main__':
  errors.run_reporting(main)
