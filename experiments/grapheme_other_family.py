"""A third synthetic grapheme family, to report on and never to choose with.

  python -m experiments.grapheme_other_family --out data/bengali-other --num 2000 --seed 0

writes a Kaggle-layout test split (as bengrapheme/grapheme/synth_val.py does) that
launch.evaluate scores as split 'test' of --data:

  python -m launch.evaluate --config configs/grapheme.py:demo --data data/bengali-other \\
      --workdir W --evals test

Why a third: the validation family (synth_val.py) chooses the recipe's settings, so its score
flatters whatever it chose. This one shares with the other two only the class map and the
render spellings. Its fonts are in neither training nor the validation family (OTHER_FONTS),
and its distortions are Albumentations' (written by other people, for other data): elastic,
grid and perspective warps, pen width by morphology, plasma shading, defocus / motion / glass
blur, noise, downscaling and JPEG. It stands in for "a generator the project has never seen";
real handwriting is still different from all three.

Every image comes from its own seed (seed, index): the output does not depend on the worker
count.
"""
import functools
import os

os.environ.setdefault('NO_ALBUMENTATIONS_UPDATE', '1')  # no network check on import
import albumentations as A  # pylint: disable=wrong-import-position
import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from bengrapheme import errors
from bengrapheme.grapheme import kaggle, synth, synth_val

OTHER_FONTS = {
    'Tiro Bangla': synth.google_font('tiro-bangla/TiroBangla_400Regular.ttf'),
    'Tiro Bangla Italic': synth.google_font('tiro-bangla/TiroBangla_400Regular_Italic.ttf'),
    'Anek Bangla Light': synth.google_font('anek-bangla/300Light/AnekBangla_300Light.ttf'),
    'Anek Bangla SemiBold': synth.google_font('anek-bangla/600SemiBold/AnekBangla_600SemiBold.ttf'),
}
SPLIT_CODE = 11  # apart from synth.py's (0, 1), rendered.py's (2) and synth_val.py's (7)


@functools.cache
def _font(name, size):
  return ImageFont.truetype(OTHER_FONTS[name], size, layout_engine=ImageFont.Layout.RAQM)


@functools.cache
def _pipeline():
  white = dict(border_mode=cv2.BORDER_CONSTANT, fill=255)
  return A.Compose([
      A.Affine(rotate=(-12, 12), shear=(-15, 15), fit_output=True, p=0.8, **white),
      A.OneOf([A.ElasticTransform(alpha=30, sigma=6, **white),
               A.GridDistortion(num_steps=5, distort_limit=0.25, **white),
               A.Perspective(scale=(0.03, 0.08), fit_output=True, **white)], p=0.8),
      # On dark-on-white images erosion spreads the ink (a broader pen), dilation thins it.
      A.OneOf([A.Morphological(scale=(2, 5), operation='erosion', p=1),
               A.Morphological(scale=(2, 3), operation='dilation', p=1)], p=0.6),
  ])


@functools.cache
def _photometric():
  return A.Compose([
      A.PlasmaBrightnessContrast(brightness_range=(-0.15, 0.1), contrast_range=(-0.4, 0.0),
                                 p=0.7),
      A.RandomGamma(gamma_limit=(70, 150), p=0.5),
      A.OneOf([A.Defocus(radius=(1, 3), alias_blur=(0.1, 0.3)),
               A.MotionBlur(blur_limit=(3, 7)),
               A.GlassBlur(sigma=0.4, max_delta=1, iterations=1)], p=0.5),
      A.GaussNoise(std_range=(0.01, 0.06), p=0.6),
      A.Downscale(scale_range=(0.4, 0.8), p=0.3),
      A.ImageCompression(quality_range=(20, 85), p=0.7),
  ])


def _text(text, font_name, size):
  """Black text on white, cropped to its ink with a margin for the warps."""
  font = _font(font_name, size)
  left, top, right, bottom = font.getbbox(text)
  margin = size // 3
  canvas = Image.new('L', (right - left + 2 * margin, bottom - top + 2 * margin), 255)
  ImageDraw.Draw(canvas).text((margin - left, margin - top), text, font=font, fill=0)
  return np.asarray(canvas)


def _frame(image, rng):
  """The ink, cropped, scaled to a random share of the frame and put anywhere in it."""
  rows, cols = np.flatnonzero((image < 128).any(1)), np.flatnonzero((image < 128).any(0))
  if not len(rows):
    raise ValueError('the warps left no ink')
  ink = image[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
  scale = min(rng.uniform(0.4, 0.92) * kaggle.HEIGHT / ink.shape[0],
              rng.uniform(0.5, 0.95) * kaggle.WIDTH / ink.shape[1])
  size = (max(1, round(ink.shape[1] * scale)), max(1, round(ink.shape[0] * scale)))
  ink = cv2.resize(ink, size, interpolation=cv2.INTER_AREA)
  frame = np.full((kaggle.HEIGHT, kaggle.WIDTH), 255, np.uint8)
  top = int(rng.integers(0, kaggle.HEIGHT - ink.shape[0] + 1))
  left = int(rng.integers(0, kaggle.WIDTH - ink.shape[1] + 1))
  frame[top:top + ink.shape[0], left:left + ink.shape[1]] = ink
  return frame


def render(text, font_name, seed):
  """One 137x236 uint8 image (dark ink, light paper) of `text` in this family's look."""
  rng = np.random.default_rng(seed)
  geometric, photometric = _pipeline(), _photometric()
  geometric.set_random_seed(int(rng.integers(2**31)))
  photometric.set_random_seed(int(rng.integers(2**31)))
  image = geometric(image=_text(text, font_name, int(rng.integers(60, 120))))['image']
  image = _frame(image, rng)
  ink = rng.uniform(0, 100)  # ink darkness; paper is near white before the shading
  image = (ink + (image.astype(np.float32) / 255) * (rng.uniform(215, 255) - ink)).astype(np.uint8)
  return photometric(image=image)['image']


def _render_job(job):
  return render(*job)


def write_dataset(out_dir, num, seed=0, workers=None, unseen_fraction=0.5):
  """Writes the family's `num` images as the Kaggle test split of out_dir, whole or not at
  all; unseen_fraction of them graphemes outside the 1,295."""
  shared = set(OTHER_FONTS.values()) & set(synth.FONTS.values())
  if shared:
    raise ValueError(f'fonts shared with training or the validation family: {sorted(shared)}')
  synth_val.write_dataset(out_dir, num, seed, workers, unseen_fraction, fonts=OTHER_FONTS,
                          job=_render_job, code=SPLIT_CODE, family='other-family')


def main():
  args = synth.arguments(__doc__, {'--num': 'number of images'}, 0.5)
  write_dataset(args.out, args.num, args.seed, args.workers, args.unseen_fraction)


if __name__ == '__main__':
  errors.run_reporting(main)
