"""What the workbench may show and take in.

Served: only images of the index, under its folder. A path is refused when it is absolute,
climbs out (`..`), is not in the index, or resolves (through a symbolic link) outside the
indexed folder: the app must not become a way to read any file of the machine.

Taken in: an uploaded query image, read into memory only up to its size limit, refused
unless it opens as a JPEG, PNG or TIFF whose pixel count is within the limit (checked from
its header before any pixel is decoded, so a decompression bomb never expands) and decodes
whole. A refused upload is never written anywhere.
"""
import functools
import io
import os

from PIL import Image, UnidentifiedImageError

from bengrapheme import errors
from retrieval.collections import collection

FORMATS = ('JPEG', 'PNG', 'TIFF')
MAX_PIXELS = 60_000_000  # a 60 Mpx scan is past any fragment photograph; a bomb is far past it


class Refused(errors.UserError):
  """A request the app turns down; `status` is its HTTP status."""

  def __init__(self, status, message):
    super().__init__(message)
    self.status = status


def resolve(root, relative, indexed):
  """The real path of the indexed image `relative` (a path relative to `root`, '/'
  separated); Refused otherwise."""
  if not relative or os.path.isabs(relative) or relative.startswith(('/', '\\')):
    raise Refused(403, f'{relative!r}: an absolute path; expected a path inside the indexed '
                  'folder, relative to it')
  if '..' in relative.replace('\\', '/').split('/'):
    raise Refused(403, f'{relative!r}: climbs out with ..; expected a path inside the indexed '
                  'folder')
  if relative not in indexed:
    raise Refused(404, f'{relative!r}: not an image of the index')
  real_root = os.path.realpath(root)
  real = os.path.realpath(os.path.join(root, relative))
  if os.path.commonpath([real, real_root]) != real_root:
    raise Refused(403, f'{relative!r}: a link to {real}, outside the indexed folder; only '
                  'images under it are served')
  return real


@functools.lru_cache(maxsize=256)  # thumbnails and the pairs of a round or two
def png(path, longest, stamp, cutout=False):
  """PNG bytes of the image as a person sees it (retrieval/collections/collection.py), its
  longest side at most `longest` px (0: full size); with `cutout`, what lies outside the
  fragment transparent (the joining table: one fragment's black surround must not hide the
  other's edge). `stamp` (size, mtime) keys the cache to the file."""
  del stamp
  try:
    rgba = collection.open_rgba(path)
    if cutout:
      rgba = rgba.copy()
      rgba[collection.outside_mask(rgba), 3] = 0
    image = Image.fromarray(rgba)
  except collection.ERRORS as e:
    raise Refused(410, f'{path}: unreadable ({e}; changed since it was indexed?); rerun '
                  'python -m launch.index on its folder') from e
  if longest and max(image.size) > longest:
    image.thumbnail((longest, longest), Image.Resampling.LANCZOS)
  out = io.BytesIO()
  image.save(out, 'PNG', compress_level=1)  # served at once: speed over size
  return out.getvalue()


# Resolutions that cameras and image editors write when they know none: they say nothing.
DEFAULT_DPI = (72, 96)


def size_and_resolution(path):
  """(width, height, pixels a centimetre or None) of the image file, from its header: its
  DPI tag (JPEG, PNG pHYs, TIFF) when it carries one that is not a default."""
  try:
    with Image.open(path) as image:
      dpi = image.info.get('dpi')
      width, height = image.size
  except collection.ERRORS as e:
    raise Refused(410, f'{path}: unreadable ({e}); rerun python -m launch.index on its '
                  'folder') from e
  if not dpi or round(float(dpi[0])) in DEFAULT_DPI or float(dpi[0]) <= 0:
    return width, height, None
  return width, height, float(dpi[0]) / 2.54


async def read_limited(stream, limit, name):
  """The request body, refused (413) as soon as it passes `limit` bytes: nothing past the
  limit is read, and nothing is written anywhere."""
  data = bytearray()
  async for chunk in stream:
    data += chunk
    if len(data) > limit:
      raise Refused(413, f'{name}: larger than the upload limit of {limit / 2**20:.0f} MiB '
                    '(launch.serve --max_upload_mb)')
  return bytes(data)


def check_upload(name, data, max_pixels=MAX_PIXELS):
  """Refused (415 or 413) unless `data` is a whole JPEG, PNG or TIFF within `max_pixels`."""
  if not data:
    raise Refused(415, f'{name}: empty; expected a JPEG, PNG or TIFF image')
  try:
    with Image.open(io.BytesIO(data)) as image:
      if image.format not in FORMATS:
        raise Refused(415, f'{name}: a {image.format} image; expected JPEG, PNG or TIFF')
      pixels = image.size[0] * image.size[1]
      if pixels > max_pixels:
        raise Refused(413, f'{name}: {image.size[0]:,} x {image.size[1]:,} pixels, more than '
                      f'the {max_pixels:,} a query may have (a decompression bomb?)')
      image.load()  # decodes it whole: a truncated or damaged file fails here
  except Refused:
    raise
  except UnidentifiedImageError:  # its message names the in-memory file object: say why
    raise Refused(415, f'{name}: not a readable image (no JPEG, PNG or TIFF header); expected '
                  'a JPEG, PNG or TIFF')
  except (*collection.ERRORS, Image.DecompressionBombWarning) as e:
    raise Refused(415, f'{name}: not a readable image ({e}); expected a JPEG, PNG or TIFF')
