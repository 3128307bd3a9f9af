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

What a scholar cites an image by, when the collection says it (the workbench shows and
exports these; retrieval/collections/iiif.py writes both files for a IIIF manifest):
  identifiers.csv  in the folder: path (relative, '/'-separated), shelfmark, iri (the IIIF
                   canvas or other IRI the image stands for), and optionally xywh (the
                   region of that canvas the image is: x,y,w,h in its pixels) and ppcm (the
                   image's pixels a centimetre)
  collection.json  in the folder: {"id": the collection's stable IRI, "label": ...}
"""
import csv
import dataclasses
import json
import os
import re

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from scipy import ndimage

from bengrapheme import console, errors
from retrieval.fragments import reader

EXTENSIONS = ('.jpg', '.jpeg', '.png', '.tif', '.tiff')
WHITE_LEVEL = 245  # JPEG leaves white paper surrounds at 250-255, rarely below 245
IDENTIFIERS, ABOUT = 'identifiers.csv', 'collection.json'
IDENTIFIER_COLUMNS = ('path', 'shelfmark', 'iri', 'xywh', 'ppcm')
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


@dataclasses.dataclass(frozen=True)
class Identifier:
  shelfmark: str
  iri: str
  xywh: str = ''  # '' : the whole of what iri names
  ppcm: float | None = None


def read_identifiers(root):
  """(the collection's stable id or None, {path: Identifier}) from root's collection.json and
  identifiers.csv when they are there; a UserError naming the file, row and field otherwise."""
  about, known = os.path.join(root, ABOUT), {}
  ident = None
  if os.path.isfile(about):
    try:
      ident = str(json.load(open(about))['id'])
    except (ValueError, KeyError, TypeError) as e:
      raise errors.UserError(f'{about}: {e!r}; expected JSON with the collection\'s stable '
                             'IRI as "id" (and a "label")')
  path = os.path.join(root, IDENTIFIERS)
  if not os.path.isfile(path):
    return ident, known
  with open(path, newline='', encoding='utf-8-sig') as f:
    rows = csv.DictReader(f)
    missing = [c for c in IDENTIFIER_COLUMNS[:3] if c not in (rows.fieldnames or [])]
    if missing:
      raise errors.UserError(f'{path}: no column {", ".join(missing)}; expected a header '
                             'path,shelfmark,iri (and optionally xywh,ppcm)')
    for n, row in enumerate(rows, 2):
      where = f'{path}: row {n}'
      for c in ('path', 'shelfmark', 'iri'):
        if not (row.get(c) or '').strip():
          raise errors.UserError(f'{where}: {c} empty; expected a value')
      xywh = (row.get('xywh') or '').strip()
      if xywh and not re.fullmatch(r'\d+,\d+,\d+,\d+', xywh):
        raise errors.UserError(f'{where}: xywh {xywh!r}; expected x,y,w,h in pixels (four '
                               'whole numbers, quoted: "10,20,300,400") or nothing')
      try:
        ppcm = float(row['ppcm']) if (row.get('ppcm') or '').strip() else None
        if ppcm is not None and not ppcm > 0:
          raise ValueError
      except ValueError:
        raise errors.UserError(f'{where}: ppcm {row["ppcm"]!r}; expected the image\'s pixels '
                               'a centimetre (a positive number) or nothing')
      known[row['path'].strip()] = Identifier(row['shelfmark'].strip(), row['iri'].strip(),
                                              xywh, ppcm)
  return ident, known


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
