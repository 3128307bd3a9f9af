"""A second synthetic family, for choosing settings: graphemes that training never draws.

  python -m bengrapheme.grapheme.synth_val --out data/bengali-val2 --num 2000 --seed 0

writes a Kaggle-layout test split (test.csv, test_image_data_{0..3}.parquet, test_labels.csv,
class_map.csv, sample_submission.csv) that launch.evaluate scores as split 'test' of --data.

Why a second family: every setting chosen on a test drawn by the training renderer
(bengrapheme/grapheme/synth.py) rewards learning that renderer's look, and real handwriting
looks like neither. This family shares only facts about the script with it (the class map,
which fonts shape which graphemes, the render spellings) and none of its drawing code:
  - fonts training never uses (synth.HELD_OUT_FONTS), drawn at their own sizes;
  - a thin-plate-spline warp of the whole grapheme through jittered control points;
  - the pen by morphology: a skeleton redrawn with a round pen of random width, or the
    glyph's own strokes thickened or thinned;
  - pressure: ink darkness that fades along a random direction, and dry-pen gaps;
  - blur (Gaussian or a short motion streak), paper with multi-scale texture and a tint,
    sensor noise, and JPEG compression at a random quality;
  - Kaggle's framing: a grapheme of varied size anywhere in the 137x236 frame, sometimes
    cut by its edge.
Half of the images (unseen_fraction) show graphemes outside the 1,295 of the real table.
Every image comes from its own generator seeded by (seed, index): the output does not depend
on the worker count.

--train N also writes a train split of N seen graphemes in this family's look, drawn with
training's fonts: for an upper bound only (how far a model trained on the family's own
distortions gets on it at the same schedule, docs/graphemes.md); it chooses nothing.
"""
import functools
import os

import cv2
import numpy as np
import scipy.ndimage
import skimage.morphology
import skimage.transform
from PIL import Image, ImageDraw, ImageFont

from bengrapheme import console, errors, files
from bengrapheme.grapheme import kaggle, synth

FONTS = synth.HELD_OUT_FONTS
SPLIT_CODE = 7  # seeds differ from synth.py's train (0) and test (1) streams
TRAIN_CODE = 8  # the --train split's stream (an upper bound, never a validation set)


# A diagnosis, not a validation set: the family's distortions on training's Debian designs
# (--fonts training), one stage at a time (--stages), says which of them a model lacks.
DIAGNOSIS_FONTS = {name: synth.TRAIN_FONTS[name] for name in ('Likhan', 'Mukti', 'Mukti Bold')}
STAGES = ('warp', 'pen', 'pressure', 'blur', 'paper')


@functools.cache
def _font(name, size):
  return ImageFont.truetype({**FONTS, **synth.TRAIN_FONTS}[name], size,
                            layout_engine=ImageFont.Layout.RAQM)


def _glyph(text, font_name, size):
  """The text as float ink in [0, 1], cropped to it, drawn at `size` px."""
  font = _font(font_name, size)
  left, top, right, bottom = font.getbbox(text)
  canvas = Image.new('L', (right - left + 16, bottom - top + 16), 0)
  ImageDraw.Draw(canvas).text((8 - left, 8 - top), text, font=font, fill=255)
  bbox = canvas.getbbox()
  if bbox is None:
    raise ValueError(f'font {font_name!r} draws nothing for {text!r}')
  return np.asarray(canvas.crop(bbox), np.float32) / 255


def _thin_plate_warp(ink, rng):
  """Moves a 4x4 grid of control points by up to ~8 % of the glyph's size."""
  h, w = ink.shape
  pad = max(h, w) // 6
  ink = np.pad(ink, pad)
  h, w = ink.shape
  ys, xs = np.meshgrid(np.linspace(0, h - 1, 4), np.linspace(0, w - 1, 4), indexing='ij')
  src = np.stack([xs.ravel(), ys.ravel()], 1)
  dst = src + rng.normal(0, 0.04, src.shape) * [w, h]
  tps = skimage.transform.ThinPlateSplineTransform.from_estimate(dst, src)
  return skimage.transform.warp(ink, tps, order=1, mode='constant').astype(np.float32)


def _pen(ink, rng):
  """A monoline pen over the skeleton, or the strokes thickened / thinned."""
  binary = ink > 0.5
  if rng.random() < 0.5:
    radius = int(rng.integers(1, 5))
    skeleton = skimage.morphology.skeletonize(binary)
    pen = skimage.morphology.dilation(skeleton, skimage.morphology.disk(radius))
    return pen.astype(np.float32)
  if rng.random() < 0.7:
    shaped = skimage.morphology.dilation(binary, skimage.morphology.disk(int(rng.integers(1, 4))))
  else:  # thinner, unless that would break the strokes of an already thin font
    shaped = skimage.morphology.erosion(binary, skimage.morphology.disk(1))
    shaped = shaped if shaped.sum() >= 0.5 * binary.sum() else binary
  return shaped.astype(np.float32)


def _crop(ink):
  rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
  return ink[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


def _frame(ink, rng):
  """The ink placed in the 137x236 frame at a Kaggle-like size and position, sometimes cut."""
  height = rng.uniform(45, 125)
  scale = min(height / ink.shape[0], rng.uniform(0.55, 1.0) * kaggle.WIDTH / ink.shape[1])
  size = (max(1, round(ink.shape[1] * scale)), max(1, round(ink.shape[0] * scale)))
  ink = cv2.resize(ink, size, interpolation=cv2.INTER_AREA)
  frame = np.zeros((kaggle.HEIGHT, kaggle.WIDTH), np.float32)
  cut = 0.12 * rng.random() if rng.random() < 0.15 else 0.0  # edge cuts a little of it
  lo_y, hi_y = -cut * ink.shape[0], kaggle.HEIGHT - ink.shape[0] * (1 - cut)
  lo_x, hi_x = -cut * ink.shape[1], kaggle.WIDTH - ink.shape[1] * (1 - cut)
  top = int(rng.uniform(lo_y, max(lo_y, hi_y)))
  left = int(rng.uniform(lo_x, max(lo_x, hi_x)))
  y0, x0 = max(top, 0), max(left, 0)
  y1, x1 = min(top + ink.shape[0], kaggle.HEIGHT), min(left + ink.shape[1], kaggle.WIDTH)
  frame[y0:y1, x0:x1] = ink[y0 - top:y1 - top, x0 - left:x1 - left]
  return frame


def _pressure(ink, rng):
  """Darkness that fades along a random direction, with a few dry-pen gaps."""
  yy, xx = np.mgrid[:ink.shape[0], :ink.shape[1]].astype(np.float32)
  angle = rng.uniform(0, 2 * np.pi)
  ramp = np.cos(angle) * xx / ink.shape[1] + np.sin(angle) * yy / ink.shape[0]
  ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
  strength = 1 - rng.uniform(0, 0.5) * ramp
  gaps = scipy.ndimage.gaussian_filter(rng.random(ink.shape).astype(np.float32), 2.0)
  dry = gaps < np.quantile(gaps, rng.uniform(0, 0.08))
  return ink * strength * ~dry


def _blur(ink, rng):
  if rng.random() < 0.3:  # a short motion streak
    length = int(rng.integers(3, 8))
    kernel = np.zeros((length, length), np.float32)
    kernel[length // 2] = 1 / length
    turn = cv2.getRotationMatrix2D((length / 2 - 0.5, length / 2 - 0.5), rng.uniform(0, 180), 1)
    kernel = cv2.warpAffine(kernel, turn, (length, length))
    return cv2.filter2D(ink, -1, kernel / max(kernel.sum(), 1e-6))
  return scipy.ndimage.gaussian_filter(ink, rng.uniform(0, 1.3))


def _paper_and_sensor(ink, rng):
  """uint8 image: textured, tinted paper under dark ink, noise, then a JPEG round trip."""
  shape = ink.shape
  texture = sum(scipy.ndimage.gaussian_filter(rng.normal(0, 1, shape), sigma) * weight
                for sigma, weight in ((1, 2.0), (6, 10.0), (30, 40.0)))
  paper = rng.uniform(205, 252) + texture * rng.uniform(0.2, 1.0)
  dark = rng.uniform(10, 110)
  image = paper + (dark - paper) * np.clip(ink, 0, 1)
  image += rng.normal(0, rng.uniform(1, 8), shape)
  image = np.clip(np.rint(image), 0, 255).astype(np.uint8)
  quality = int(rng.integers(25, 90))
  ok, encoded = cv2.imencode('.jpg', image, [cv2.IMWRITE_JPEG_QUALITY, quality])
  assert ok
  return cv2.imdecode(encoded, cv2.IMREAD_GRAYSCALE)


def render(text, font_name, seed, stages=STAGES):
  """One 137x236 uint8 image (0 = ink, 255 = paper) of `text` in this family's look; without
  some of its `stages` for a diagnosis (without 'paper': dark ink on plain paper)."""
  rng = np.random.default_rng(seed)
  ink = _glyph(text, font_name, int(rng.integers(64, 112)))
  if 'warp' in stages:
    ink = _thin_plate_warp(ink, rng)
  if 'pen' in stages:
    ink = _pen(ink, rng)
  ink = _frame(_crop(ink), rng)
  if 'pressure' in stages:
    ink = _pressure(ink, rng)
  if 'blur' in stages:
    ink = _blur(ink, rng)
  if 'paper' in stages:
    return _paper_and_sensor(ink, rng)
  return np.clip(np.rint(245 - 225 * np.clip(ink, 0, 1)), 0, 255).astype(np.uint8)


def _render_job(job, stages=STAGES):
  return render(*job, stages=stages)


def plan(num, seed, unseen_fraction, fonts=FONTS, code=SPLIT_CODE, prefix='Test'):
  """Rows (image_id, root, vowel, consonant, grapheme, text, font, seen) of the images."""
  rng = np.random.default_rng([seed, code])
  seen = rng.permutation(np.arange(num) >= round(num * unseen_fraction))
  return synth.plan_rows(rng, prefix, seen, [fonts] * num)


def write_dataset(out_dir, num, seed=0, workers=None, unseen_fraction=0.5, fonts=FONTS,
                  job=None, code=SPLIT_CODE, family='validation-family', num_train=0):
  """Writes the family's `num` images as the Kaggle test split of out_dir, whole or not at
  all, and `num_train` seen graphemes in training's fonts as its train split. fonts, job
  ((text, font, seed) -> image), code and family: another family's (as
  experiments/grapheme_other_family.py draws)."""
  if not isinstance(num, (int, np.integer)) or num < 1:
    raise ValueError(f'num must be a positive integer, got {num!r}')
  if not isinstance(num_train, (int, np.integer)) or num_train < 0:
    raise ValueError(f'num_train must be a non-negative integer, got {num_train!r}')
  if not 0 <= unseen_fraction <= 1:
    raise ValueError(f'unseen_fraction must be in [0, 1], got {unseen_fraction}')
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise errors.NotEmpty(f'{out_dir} is not empty; choose a new --out (nothing was written)')
  rows = plan(num, seed, unseen_fraction, fonts, code)
  train = plan(num_train, seed, 0.0, synth.TRAIN_FONTS, TRAIN_CODE, 'Train')
  workers = workers or len(os.sched_getaffinity(0))
  with errors.on_ctrl_c(f'Interrupted (Ctrl-C) while writing {out_dir}: nothing was left '
                        'there; rerun to write it.'), \
      files.atomic_dir(out_dir, durable=False) as tmp, \
      console.Progress(num + num_train, f'drawing {family} graphemes',
                       unit='image') as progress, \
      synth.parallel_map(workers) as imap:
    synth.write_images(str(tmp), 'test', rows, seed, code, imap, progress, job or _render_job)
    if train:
      synth.write_images(str(tmp), 'train', train, seed, TRAIN_CODE, imap, progress,
                         job or _render_job)
      synth.write_tables(tmp, train, rows)
    else:
      synth.write_test_tables(tmp, rows)


def main():
  args = synth.arguments(__doc__, {'--num': 'number of images'}, 0.5, more={
      '--train': dict(type=int, default=0,
                      help="seen graphemes in training's fonts as a train split (an upper bound)"),
      '--fonts': dict(choices=('family', 'training'), default='family',
                      help="'training': training's Debian designs, for a diagnosis only"),
      '--stages': dict(default=','.join(STAGES),
                       help=f'comma-separated, of {",".join(STAGES)} (fewer: a diagnosis)')})
  stages = tuple(s for s in args.stages.split(',') if s)
  unknown = sorted(set(stages) - set(STAGES))
  if unknown:
    raise errors.UserError(f'--stages: unknown {",".join(unknown)}; expected some of '
                           f'{",".join(STAGES)}')
  write_dataset(args.out, args.num, args.seed, args.workers, args.unseen_fraction,
                fonts=DIAGNOSIS_FONTS if args.fonts == 'training' else FONTS,
                job=functools.partial(_render_job, stages=stages), num_train=args.train)


if __name__ == '__main__':
  errors.run_reporting(main)
