"""A scholar's collection: any folder of fragment images, nested, with any names and no labels.

Images are .jpg / .jpeg / .png / .tif / .tiff (any case), colour or grey, 8 or 16 bit, any
size. What lies outside the fragment may be black (HisFrag20), white, or transparent (an
alpha channel); each image is brought to the HisFrag20 convention the patch extractor and
SRS-LBP read (retrieval/fragments/reader.py): outside black (every channel <= BLACK_THRESHOLD), inside
brighter than that.

  alpha      any pixel not opaque: alpha < 128 is outside
  black      half of the image's one-pixel frame is black: as HisFrag20, left as it is
  white      half of the frame is white (every channel >= WHITE_LEVEL): the white pixels
             connected to the frame are outside
  otherwise  the whole image is the fragment (a photo of a page, a crop of text)

Inside the fragment, pixels as dark as the black outside are lifted just above it, so the
darkest ink of a white- or alpha-surrounded fragment is not taken for its outside (a
HisFrag20 fragment has no such pixel, so it reads exactly as retrieval/fragments/reader.py reads it).
"""
import dataclasses
import os

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from scipy import ndimage

from bengrapheme import console
from retrieval.fragments import reader

EXTENSIONS = ('.jpg', '.jpeg', '.png', '.tif', '.tiff')
WHITE_LEVEL = 245  # JPEG leaves white paper surrounds at 250-255, rarely below 245
ERRORS = (OSError, SyntaxError, ValueError, UnidentifiedImageError, Image.DecompressionBombError)


class Unreadable(reader.DataError):
  """One image of a collection that cannot be used; indexing counts it and goes on."""


@dataclasses.dataclass(frozen=True)
class Listing:
  root: str
  paths: list  # relative to root, '/'-separated, sorted: the images
  others: list  # relative paths of files that are not images by their extension
  hidden: list = dataclasses.field(default_factory=list)  # names starting '.', left out
  # Linked folders already listed through another path (a link cycle, or two links to one
  # folder): each folder's images are listed once.
  repeated: list = dataclasses.field(default_factory=list)


def list_images(root):
  """Every image under `root` (nested folders and links followed, each real folder once;
  hidden files and folders left out and counted), sorted."""
  if not os.path.isdir(root):
    problem = 'is a file' if os.path.exists(root) else 'no such folder'
    raise reader.DataError(f'{root}: {problem}; expected a folder of fragment images '
                           f'({", ".join(EXTENSIONS)}), nested folders allowed')
  paths, others, hidden, repeated = [], [], [], []
  inside = os.path.realpath(root) + os.sep
  seen = {os.path.realpath(root)}
  for folder, dirs, names in os.walk(root, followlinks=True):
    relative = lambda name: os.path.relpath(os.path.join(folder, name), root).replace(os.sep,
                                                                                      '/')
    kept = []
    for d in sorted(dirs):
      real = os.path.realpath(os.path.join(folder, d))
      if d.startswith('.'):
        hidden.append(relative(d))
      # A link to a folder inside the root: listed under its own path instead.
      elif real in seen or (os.path.islink(os.path.join(folder, d)) and
                            (real + os.sep).startswith(inside)):
        repeated.append(relative(d))
      else:
        kept.append(d)
        seen.add(real)
    dirs[:] = kept
    for name in names:
      if name.startswith('.'):
        hidden.append(relative(name))
      else:
        (paths if name.lower().endswith(EXTENSIONS) else others).append(relative(name))
  if not paths:
    raise reader.DataError(f'{root}: no images ({", ".join(EXTENSIONS)}) in it or its '
                           'subfolders')
  return Listing(root, sorted(paths), sorted(others), sorted(hidden), sorted(repeated))


def say_left_out(listing):
  """Names what the listing left out, one line a kind, with an example of each."""
  for found, why in ((listing.others, 'are not images by their extension '
                      f'({", ".join(EXTENSIONS)})'),
                     (listing.hidden, 'are hidden (their names start with a dot)'),
                     (listing.repeated, 'are links to folders listed already (each folder '
                      'is listed once; a link cycle ends there)')):
    if found:
      console.say(f'{len(found):,} files or folders under {listing.root} {why} and are left '
                  f'out, e.g. {found[0]}')


def open_rgba(path):
  """The image as a person sees it: RGBA uint8 [H, W, 4], EXIF rotation applied (phone photos
  carry theirs), 16-bit and float greys scaled to their range."""
  with Image.open(path) as opened:
    image = ImageOps.exif_transpose(opened)
  if image.mode in ('I;16', 'I;16B', 'I;16L', 'I', 'F'):
    grey = np.asarray(image, np.float64)
    low, high = grey.min(), grey.max()
    grey = (grey - low) / max(high - low, 1e-12) * 255
    image = Image.fromarray(grey.round().astype(np.uint8))
  return np.asarray(image.convert('RGBA'))


def outside_mask(rgba):
  """bool [H, W]: what is not the fragment (module docstring)."""
  rgb, alpha = rgba[..., :3], rgba[..., 3]
  if (alpha < 255).any():
    return alpha < 128
  frame = np.concatenate([rgb[0], rgb[-1], rgb[:, 0], rgb[:, -1]])
  if (frame.max(axis=-1) <= reader.BLACK_THRESHOLD).mean() >= 0.5:
    return rgb.max(axis=-1) <= reader.BLACK_THRESHOLD
  if (frame.min(axis=-1) >= WHITE_LEVEL).mean() >= 0.5:
    white = rgb.min(axis=-1) >= WHITE_LEVEL
    labels, _ = ndimage.label(white)
    touching = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    return np.isin(labels, touching[touching > 0])
  return np.zeros(rgb.shape[:2], bool)


def read_fragment(path):
  """RGB uint8 [H, W, 3] of one image, outside black and inside above BLACK_THRESHOLD;
  Unreadable (naming the file and why) for an empty, unreadable or all-outside image."""
  try:
    size = os.path.getsize(path)
  except FileNotFoundError:
    raise Unreadable(f'{path}: no such file (a link to nothing, or removed since the folder '
                     'was listed)') from None
  if size == 0:
    raise Unreadable(f'{path}: empty file (0 bytes)')
  try:
    rgba = open_rgba(path)
  except ERRORS as e:
    raise Unreadable(f'{path}: unreadable image ({e})') from e
  outside = outside_mask(rgba)
  if outside.all():
    raise Unreadable(f'{path}: nothing inside the fragment (all transparent, black or white)')
  rgb = rgba[..., :3].copy()
  rgb[~outside & (rgb.max(axis=-1) <= reader.BLACK_THRESHOLD)] = reader.BLACK_THRESHOLD + 1
  rgb[outside & (rgb.max(axis=-1) > reader.BLACK_THRESHOLD)] = 0  # a black outside stays as is
  return rgb


class CollectionSource(reader.FragmentSource):
  """A collection as the fragment pipeline's listing (retrieval/fragments/data.py): every image its own
  'writer' and 'page' (there are no labels), read by read_fragment."""

  def __init__(self, root, size, color=False):
    listing = list_images(root)
    fragments = [reader.Fragment(os.path.join(root, p), i, i, 0)
                 for i, p in enumerate(listing.paths)]
    super().__init__(root, size, color, fragments)
    say_left_out(listing)

  def read_rgb(self, index):
    return read_fragment(self.fragments[index].path)
