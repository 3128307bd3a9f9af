"""Reads a HisFrag20 split: one folder of colour JPEG fragments named WID_PID_FID.jpg.

Outside the fragment the image is black. JPEG smears that black a little at the fragment's
edge and leaves faint noise in it, so "black" means every channel <= BLACK_THRESHOLD.
"""
import io
import os
import re
import typing

import numpy as np
from PIL import Image, ImageChops

from bengrapheme import errors

BLACK_THRESHOLD = 20
_NAME = re.compile(r'(\d+)_(\d+)_(\d+)\.jpg', re.IGNORECASE)


class DataError(errors.UserError, ValueError):
  """A fragment file or folder that does not hold what HisFrag20 promises."""


class Fragment(typing.NamedTuple):
  path: str
  writer: int  # WID as in the file name
  page: int  # PID as in the file name
  fragment: int  # FID as in the file name


def parse_name(path):
  """(writer, page, fragment) ids from a file named WID_PID_FID.jpg."""
  match = _NAME.fullmatch(os.path.basename(path))
  if match is None:
    raise DataError(f'{path}: expected a fragment named WID_PID_FID.jpg (integers)')
  return int(match.group(1)), int(match.group(2)), int(match.group(3))


def list_fragments(folder):
  """Every fragment in folder as Fragment, sorted by (writer, page, fragment).

  Every entry must be a fragment: a stray file is reported, not skipped, so that a wrong
  folder or a broken copy cannot pass unnoticed.
  """
  if not os.path.isdir(folder):
    problem = 'is a file' if os.path.exists(folder) else 'no such folder'
    raise DataError(f'{folder}: {problem}; expected a folder of WID_PID_FID.jpg fragments')
  items = []
  for name in os.listdir(folder):
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
      raise DataError(f'{path}: expected only WID_PID_FID.jpg files in {folder}')
    items.append(Fragment(path, *parse_name(path)))
  if not items:
    raise DataError(f'{folder}: no fragments (expected WID_PID_FID.jpg files)')
  items.sort(key=lambda f: (f.writer, f.page, f.fragment, f.path))
  for a, b in zip(items, items[1:]):
    if a[1:] == b[1:]:
      raise DataError(f'{b.path}: same writer, page and fragment ids as {a.path}')
  return items


def decode(path, data=None):
  """RGB uint8 [H, W, 3]; DataError naming the file for anything but a readable image.

  data: the file's bytes when they are stored elsewhere (a TFDS record); path then only
  names the fragment in errors.
  """
  if (os.path.getsize(path) if data is None else len(data)) == 0:
    raise DataError(f'{path}: empty file (0 bytes), expected a JPEG fragment')
  try:
    with Image.open(path if data is None else io.BytesIO(data)) as image:
      rgb = np.asarray(image.convert('RGB'))
  except (OSError, SyntaxError, ValueError) as e:  # Pillow's errors for corrupt or truncated
    raise DataError(f'{path}: unreadable image ({e}), expected a JPEG fragment') from e
  if not (rgb > BLACK_THRESHOLD).any():
    raise DataError(f'{path}: all black, expected a fragment with visible content')
  return rgb


def convert(rgb, color):
  return rgb if color else np.asarray(Image.fromarray(rgb).convert('L'))


def load_fragment(path, color=True):
  """The fragment as uint8 [H, W, 3] (color) or [H, W] (grey)."""
  return convert(decode(path), color)


def fit_to_square(image, size):
  """image [H, W] or [H, W, C] scaled to fit size x size keeping its aspect, centred on black."""
  h, w = image.shape[:2]
  scale = size / max(h, w)
  new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
  resized = np.asarray(Image.fromarray(image).resize((new_w, new_h),
                                                     Image.Resampling.BILINEAR))
  out = np.zeros((size, size) + image.shape[2:], np.uint8)
  top, left = (size - new_h) // 2, (size - new_w) // 2
  out[top:top + new_h, left:left + new_w] = resized
  return out


class FragmentSource:
  """grain random-access source over one HisFrag20 folder.

  Record i: image uint8 [size, size, C] (C = 3 colour, 1 grey), the fragment fitted and
  centred on black; writer and page as dense int32 indices (pages are (WID, PID) pairs);
  index = i; valid_pixels = the fragment's non-black pixel count at its own size.
  Holds only the file list, so it pickles small and each read opens its own file, which is
  what grain's worker threads and processes need.
  """

  def __init__(self, folder, size, color=True, fragments=None):
    """fragments: the listing of folder, when it comes from elsewhere (a TFDS build)."""
    self.folder, self.size, self.color = folder, size, color
    self.fragments = list_fragments(folder) if fragments is None else fragments
    writers = sorted({f.writer for f in self.fragments})
    pages = sorted({(f.writer, f.page) for f in self.fragments})
    writer_index = {w: i for i, w in enumerate(writers)}
    page_index = {p: i for i, p in enumerate(pages)}
    self.writer_ids = np.array([writer_index[f.writer] for f in self.fragments], np.int32)
    self.page_ids = np.array([page_index[(f.writer, f.page)] for f in self.fragments],
                             np.int32)
    self.num_writers, self.num_pages = len(writers), len(pages)

  def __len__(self):
    return len(self.fragments)

  def read_rgb(self, index):
    """The fragment as RGB uint8 [H, W, 3] at its own size."""
    return decode(self.fragments[index].path)

  def __getitem__(self, index):
    rgb = self.read_rgb(index)
    image = fit_to_square(convert(rgb, self.color), self.size)
    return dict(
        image=image if self.color else image[..., None],
        writer=self.writer_ids[index],
        page=self.page_ids[index],
        index=np.int32(index),
        valid_pixels=np.int32(valid_pixel_count(rgb)),
    )

  def __repr__(self):
    return (f'FragmentSource({self.folder!r}, size={self.size}, color={self.color}: '
            f'{len(self)} fragments, {self.num_writers} writers, {self.num_pages} pages)')


def valid_pixel_count(rgb):
  """Pixels of rgb [H, W, 3] with any channel above BLACK_THRESHOLD (inside the fragment).

  Counted by Pillow (max of the bands, then a histogram): the numpy
  `(rgb > t).any(axis=-1).sum()` took 15.5 ms a fragment against 2.6 ms, most of a read.
  """
  r, g, b = Image.fromarray(rgb).split()
  brightest = ImageChops.lighter(ImageChops.lighter(r, g), b)
  return brightest.width * brightest.height - sum(brightest.histogram()[:BLACK_THRESHOLD + 1])
