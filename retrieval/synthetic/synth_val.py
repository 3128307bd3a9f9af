"""A second synthetic family of fragments, for choosing the recipe: drawn unlike retrieval/synthetic/synth.py.

  python -m retrieval.synthetic.synth_val --out data/fragments-valfam --writers 40 --seed 0
  python -m retrieval.synthetic.synth_val --out data/fragments-third --writers 32 --seed 1 --draw third

writes OUT/test/WID_PID_FID.jpg (the HisFrag20 layout retrieval/fragments/reader.py reads), scored as
split 'test' of a folder whose train/ is training's (experiments/fragment_family.py builds it).

Why a second family: a recipe chosen on writers drawn by the training generator rewards its
look, and real collections differ from it in ways a recipe must survive. This family keeps
synth.py's text, page renderer and fragmenter (imported, not copied) and changes what is drawn:
  - fonts: the fonts of synth.py that make demo-fragments' draw (seed 0, 90 writers) never
    uses, split in two halves, one for this family ('val') and one for the third draw
    ('third'), so neither shares a font with training, its test or each other;
  - a pen: a broad nib (a line at the writer's angle, 1-4 px wide, dilating every stroke), so
    thick and thin strokes follow the nib's angle, which training's fonts never do;
  - hands: writers come in groups of HAND_SIZE (8; synth.py's 6) trained in one hand: the
    group shares font, size, slant, spacing and nib, and each writer adds small personal
    habits (a few per cent of size and spacing, a few degrees of slant and nib angle);
  - pages drift further from their writer (synth.page_style's drift, then as much again), a
    fifth of them much further (written years apart);
  - scans at other resolutions: each page is scanned at 0.5-1.8x (synth.py: 0.7-1.3x), the
    resolutions of several archives;
  - other papers and inks, and damage: creases, abraded ink and holes; fragments cut from
    pages in 3 to 10 pieces (synth.py: 6), so some are much smaller or larger.

It chooses settings and never trains. --train N also writes OUT/train: N writers in this
family's look drawn with training's own fonts (synth.py's demo draw), for an upper bound
only (how far the recipe gets when it trains on the family's look; docs/fragments.md).

Every page depends only on (seed, draw, writer, page): the output does not depend on --workers.
"""
import argparse
import functools
import os

import cv2
import numpy as np

from bengrapheme import errors, files
from retrieval.synthetic import fragments, synth

HAND_SIZE = 8  # writers trained in one hand
DEMO_SEED, DEMO_WRITERS = 0, 90  # make demo-fragments' draw (60 train + 30 test writers)
# Seed streams apart from synth.py's (which seeds by [seed, writer, page] alone).
CODES = {'val': 40, 'third': 41, 'train': 42}
WRITER_BASE = {'val': 1000, 'third': 2000, 'train': 0}  # file ids: the draws never collide
# Papers and inks synth.py never draws: greyed rag paper, bluish and dark parchment, and
# grey, reddish and faded iron-gall inks.
PAPERS = ((200, 200, 192), (188, 194, 200), (176, 150, 112), (232, 222, 214), (160, 140, 110))
INKS = ((30, 30, 30), (96, 40, 30), (84, 78, 70), (60, 52, 44), (40, 48, 70))


def demo_fonts():
  """The fonts (relative paths) of make demo-fragments' draw, train and test writers."""
  return {synth.writer_font(DEMO_SEED, w) for w in range(1, DEMO_WRITERS + 1)}


@functools.cache
def draw_fonts(draw):
  """synth.FONTS entries for a draw: 'train' the demo draw's own fonts; 'val' and 'third' the
  two halves (alternating, in synth.FONTS order) of the fonts the demo draw never uses."""
  used = demo_fonts()
  if draw == 'train':
    return tuple(f for f in synth.FONTS if f[1] in used)
  rest = [f for f in synth.FONTS if f[1] not in used]
  return tuple(rest[0::2] if draw == 'val' else rest[1::2])


def hand_style(seed, draw, hand):
  """A hand (a school): synth.writer_style drawn from this draw's fonts, plus a broad nib."""
  stream = seed * 100 + CODES[draw]
  style = synth.writer_style(stream, hand, fonts=draw_fonts(draw), writers_per_hand=1)
  rng = np.random.default_rng([stream, hand, 1])
  return dict(style, stroke=0, nib_angle=rng.uniform(0, np.pi),
              nib_width=rng.uniform(0.08, 0.3), ink=np.array(INKS[rng.integers(len(INKS))],
                                                             np.float64))


def writer_style(seed, draw, writer):
  """A writer: the hand of its group with small personal habits."""
  style = hand_style(seed, draw, (writer - 1) // HAND_SIZE + 1)
  rng = np.random.default_rng([seed * 100 + CODES[draw], writer, 2])
  x_height = style['x_height'] * rng.lognormal(0, 0.05)
  spacing = rng.lognormal(0, 0.06)
  return dict(
      style, x_height=x_height, size=max(8, int(round(style['size'] * x_height /
                                                          style['x_height']))),
      slant=style['slant'] + rng.normal(0, 0.04),
      tracking=style['tracking'] * spacing, word_gap=style['word_gap'] * spacing,
      line_gap=style['line_gap'] * rng.lognormal(0, 0.05),
      wobble=style['wobble'] * rng.lognormal(0, 0.2),
      nib_angle=style['nib_angle'] + rng.normal(0, 0.1),
      nib_width=style['nib_width'] * rng.lognormal(0, 0.1))


def page_style(style, rng):
  """synth.page_style's drift, then as much again (a fifth of the pages three times as
  much: written years apart), another paper and ink, and a scan at 0.5-1.8x."""
  page = synth.page_style(style, rng)
  far = 3.0 if rng.uniform() < 0.2 else 1.0
  x_height = page['x_height'] * rng.lognormal(0, 0.12 * far)
  return dict(
      page, x_height=x_height,
      size=max(8, int(round(page['size'] * x_height / page['x_height']))),
      slant=page['slant'] + rng.normal(0, 0.07 * far),
      word_gap=page['word_gap'] * rng.lognormal(0, 0.1 * far),
      nib_angle=page['nib_angle'] + rng.normal(0, 0.1 * far),
      ink=np.clip((style['ink'] if rng.uniform() < 0.6 else np.array(
          INKS[rng.integers(len(INKS))])) + rng.normal(0, 8, 3), 0, 255),
      paper=np.clip(np.array(PAPERS[rng.integers(len(PAPERS))]) + rng.normal(0, 6, 3), 0, 255),
      scan_scale=float(np.exp(rng.uniform(np.log(0.5), np.log(1.8)))))


def nib(style):
  """The pen: coverage dilated by a line of nib_width x-heights at nib_angle."""
  length = max(1, int(round(style['nib_width'] * style['x_height'])))
  kernel = np.zeros((2 * length + 1, 2 * length + 1), np.uint8)
  dx, dy = np.cos(style['nib_angle']) * length / 2, np.sin(style['nib_angle']) * length / 2
  cv2.line(kernel, (round(length - dx), round(length - dy)), (round(length + dx),
                                                               round(length + dy)), 1)
  return lambda coverage: cv2.dilate(coverage, kernel)


def damage(image, rng):
  """Creases (light and dark lines), abraded ink (patches faded to paper) and holes (black,
  as the scanner's background shows through) on a page [H, W, 3] uint8."""
  page = image.astype(np.float32)
  h, w = page.shape[:2]
  paper = np.median(page.reshape(-1, 3), axis=0)
  worn = np.clip(synth._smooth_field(h, w, rng, cells=6) - rng.uniform(0.8, 1.6), 0, 1)
  page += worn[..., None] * (paper - page) * rng.uniform(0.4, 0.9)
  lines = np.zeros((h, w), np.float32)
  for _ in range(rng.poisson(1.5)):
    x0, x1 = rng.uniform(0, w, 2)
    cv2.line(lines, (int(x0), 0), (int(x1), h - 1), float(rng.uniform(-0.25, 0.15)),
             int(rng.integers(1, 4)))
  page *= 1 + cv2.GaussianBlur(lines, (0, 0), 1.5)[..., None]
  for _ in range(rng.poisson(1.0)):
    centre = (int(rng.uniform(0, w)), int(rng.uniform(0, h)))
    axes = (int(rng.uniform(4, 30)), int(rng.uniform(4, 30)))
    cv2.ellipse(page, centre, axes, float(rng.uniform(0, 180)), 0, 360, (0, 0, 0), -1)
  return np.clip(page, 0, 255).astype(np.uint8)


def _page_job(job):
  out_dir, seed, draw, writer, page, (width, height), quality = job
  rng = np.random.default_rng([seed * 100 + CODES[draw], writer, page])
  style = page_style(writer_style(seed, draw, writer), rng)
  image, text_box = synth.render_page(style, rng, width, height, pen=nib(style))
  image = damage(image, rng)
  params = fragments.FragmentParams(ds_cells=int(rng.integers(3, 11)), jpeg_quality=quality)
  pieces = fragments.cut_page(image, rng, params, text_box)
  return len(fragments.save_fragments(out_dir, WRITER_BASE[draw] + writer, page, pieces,
                                      params.jpeg_quality))


def write_dataset(out_dir, writers, pages_per_writer=4, seed=0, draw='val', train_writers=0,
                  workers=1, page_size=(1000, 1400), quality=85):
  """Writes out_dir/test (the draw's writers) and, with train_writers, out_dir/train (the
  family's look in training's fonts); returns {split: fragment count}."""
  if draw not in ('val', 'third'):
    raise ValueError(f"draw {draw!r}: expected 'val' or 'third'")
  if min(writers, pages_per_writer) < 1 or train_writers < 0:
    raise ValueError(f'write_dataset: need writers >= 1 and pages_per_writer >= 1, '
                     f'train_writers >= 0; got {writers}, {pages_per_writer}, {train_writers}')
  synth.check_fonts()
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise errors.NotEmpty(f'{out_dir}: already holds files; expected a new or empty folder')
  splits = [('test', draw, writers)] + ([('train', 'train', train_writers)] if train_writers
                                        else [])
  with errors.on_ctrl_c(f'Interrupted (Ctrl-C) while writing {out_dir}: nothing was left '
                        'there; rerun to write it.'), \
      files.atomic_dir(out_dir, durable=False) as tmp:
    jobs, names = [], []
    for split, stream, count in splits:
      fragments.make_empty_dir(os.path.join(tmp, split))
      for writer in range(1, count + 1):
        for k in range(pages_per_writer):
          page = WRITER_BASE[stream] * pages_per_writer + (writer - 1) * pages_per_writer + k + 1
          jobs.append((os.path.join(tmp, split), seed, stream, writer, page, page_size,
                       quality))
          names.append(split)
    counts = fragments.run_jobs(_page_job, jobs, workers, 'writing pages and fragments', 'page')
  return {split: sum(c for c, s in zip(counts, names) if s == split) for split, _, _ in splits}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', required=True)
  parser.add_argument('--writers', type=int, default=40, help='writers of the draw (test/)')
  parser.add_argument('--pages-per-writer', type=int, default=4)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--draw', choices=('val', 'third'), default='val',
                      help="'val' chooses; 'third' (other fonts) only reports")
  parser.add_argument('--train', type=int, default=0, metavar='N',
                      help="also write train/: N writers in the family's look, training's "
                      'fonts (an upper bound only)')
  parser.add_argument('--workers', type=int, default=os.cpu_count())
  args = parser.parse_args(argv)
  counts = write_dataset(args.out, args.writers, args.pages_per_writer, args.seed, args.draw,
                         args.train, args.workers)
  print(f'wrote {counts} fragments to {args.out}')


if __name__ == '__main__':
  errors.run_reporting(main)
