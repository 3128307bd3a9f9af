"""Cuts page images into fragments the way the HisFrag20 organisers did.

Two kinds of cut, chosen per page:
- random shapes: a diamond-square height map over the text area, binarised at
  |v - mean| >= margin; the cuts are where the map crosses its mean, and the pieces are the
  4-connected components on either side of them;
- rectangle-like pieces: wavy horizontal and vertical cuts from 1-D midpoint displacement,
  with a cut width that varies the same way.
In both, the outer border of the cut area is torn by 1-D midpoint displacement, pieces below
`min_share` of the text area are dropped, and each piece is cropped to its bounding box with
black (0) outside it. Fragments are saved as JPEG `WID_PID_FID.jpg`.

Two additions to the paper's description, both from looking at the output: the height map is
spread wider than 0-255 (`ds_spread`), else the band around the mean takes ~15 % of the text;
and holes a piece encloses are given to it, since the mean crossing of a fractal leaves the
large pieces riddled with islands that torn paper does not have.

  python -m retrieval.synthetic.fragments --pages PAGES --out FRAGMENTS --seed 0 --workers 2
"""
import argparse
import contextlib
import dataclasses
import os
import re
import typing

import numpy as np
from PIL import Image
from scipy import ndimage

from bengrapheme import console, errors

# 4-connectivity: pieces touching only at a corner are separate pieces.
_FOUR = ndimage.generate_binary_structure(2, 1)
_PAGE_NAME = re.compile(r'(\d+)_(\d+)\.(png|jpg|jpeg)', re.IGNORECASE)


class Piece(typing.NamedTuple):
  image: np.ndarray  # the piece cropped to its bounding box, black (0) outside mask
  mask: np.ndarray  # bool, True on the piece
  offset: tuple  # (top, left) of the crop in the page


@dataclasses.dataclass(frozen=True)
class FragmentParams:
  """Every knob of the fragmenter; scalar fields so a config or the CLI can fill them."""
  rect_prob: float = 0.3  # share of pages cut with wavy straight cuts instead of random shapes
  min_share: float = 0.025  # smallest kept piece, as a share of the text-box area
  # Random shapes.
  margin: float = 8.0  # half the height-map band removed around the mean: the cut width
  ds_cells: int = 6  # random seed values across the longer side: sets the number of pieces
  ds_roughness: float = 0.8  # H of the fractal: lower is rougher edges
  ds_spread: float = 128.0  # standard deviation of the map on the 0-255 scale of `margin`
  # Wavy cuts.
  rect_rows_min: int = 2
  rect_rows_max: int = 4
  rect_cols_min: int = 1
  rect_cols_max: int = 3
  wave_amplitude: float = 0.12  # displacement, as a share of the distance between cuts
  wave_roughness: float = 0.6
  cut_width: float = 4.0  # mean cut width in pixels
  cut_width_amplitude: float = 3.0
  # Ragged border: the text box is grown by `border_grow` (share of its size), then torn
  # inwards by up to twice `border_depth` (same unit).
  border_grow: float = 0.04
  border_depth: float = 0.025
  border_roughness: float = 0.55
  # Text-box detection for pages given without one: ink is `ink_delta` darker than paper.
  ink_delta: float = 60.0
  jpeg_quality: int = 90

  def __post_init__(self):
    if not 0 <= self.rect_prob <= 1 or not 0 < self.min_share < 1:
      raise ValueError(f'FragmentParams: rect_prob must be in [0, 1] and min_share in (0, 1): '
                       f'{self}')
    if self.rect_rows_min < 1 or self.rect_cols_min < 1 or (
        self.rect_rows_max < self.rect_rows_min or self.rect_cols_max < self.rect_cols_min):
      raise ValueError(f'FragmentParams: need 1 <= rect_*_min <= rect_*_max: {self}')
    if self.ds_cells < 1 or self.margin <= 0 or self.cut_width < 1:
      raise ValueError(f'FragmentParams: need ds_cells >= 1, margin > 0, cut_width >= 1: '
                       f'{self}')


def midpoint_displacement(n, roughness, rng):
  """1-D fractal profile of length n, roughly in [-1, 1]: recursive midpoint displacement."""
  levels = max(1, int(np.ceil(np.log2(max(n - 1, 1)))))
  line = rng.uniform(-1, 1, size=2)
  scale = 1.0
  for _ in range(levels):
    scale *= 2.0 ** -roughness
    mids = (line[:-1] + line[1:]) / 2 + scale * rng.normal(size=len(line) - 1)
    line = np.stack([line, np.append(mids, 0)], axis=1).ravel()[:-1]
  return np.interp(np.linspace(0, len(line) - 1, n), np.arange(len(line)), line)


def diamond_square(height, width, cells, roughness, rng):
  """2-D fractal height map [height, width] by the diamond-square algorithm.

  The coarse grid holds `cells + 1` random values across the longer side; each level halves
  the step and multiplies the displacement by 2^-roughness.
  """
  levels = max(0, int(np.ceil(np.log2(max(height, width) / cells))))
  step = 2 ** levels
  size = cells * step + 1
  a = np.zeros((size, size))
  a[::step, ::step] = rng.normal(size=(cells + 1, cells + 1))
  scale = 1.0
  while step > 1:
    half = step // 2
    scale *= 2.0 ** -roughness
    # Diamond step: square centres from their four corners.
    centres = (a[:-1:step, :-1:step] + a[step::step, :-1:step] + a[:-1:step, step::step]
               + a[step::step, step::step]) / 4
    centres += scale * rng.normal(size=centres.shape)
    a[half::step, half::step] = centres
    # Square step: edge midpoints from their two corners and the one or two centres beside.
    total = a[::step, :-1:step] + a[::step, step::step]
    count = np.full(total.shape, 2.0)
    total[1:] += centres
    total[:-1] += centres
    count[1:] += 1
    count[:-1] += 1
    a[::step, half::step] = total / count + scale * rng.normal(size=total.shape)
    total = a[:-1:step, ::step] + a[step::step, ::step]
    count = np.full(total.shape, 2.0)
    total[:, 1:] += centres
    total[:, :-1] += centres
    count[:, 1:] += 1
    count[:, :-1] += 1
    a[half::step, ::step] = total / count + scale * rng.normal(size=total.shape)
    step = half
  return a[:height, :width]


def find_text_box(page, ink_delta):
  """(top, left, bottom, right) around the ink: pixels ink_delta darker than the paper.

  The 0.5 and 99.5 percentiles of the ink coordinates keep specks and stains at the page edge
  from stretching the box. A page without ink gives the whole page.
  """
  gray = page.mean(axis=2) if page.ndim == 3 else page.astype(np.float64)
  rows, cols = np.nonzero(gray < np.median(gray) - ink_delta)
  if len(rows) == 0:
    return 0, 0, page.shape[0], page.shape[1]
  top, bottom = np.percentile(rows, [0.5, 99.5]).astype(int)
  left, right = np.percentile(cols, [0.5, 99.5]).astype(int)
  return top, left, bottom + 1, right + 1


def _cut_area(shape, text_box, params, rng):
  """Box to cut (text box grown by border_grow) and the mask inside its ragged border."""
  top, left, bottom, right = text_box
  grow_y = int(round(params.border_grow * (bottom - top)))
  grow_x = int(round(params.border_grow * (right - left)))
  top, left = max(0, top - grow_y), max(0, left - grow_x)
  bottom, right = min(shape[0], bottom + grow_y), min(shape[1], right + grow_x)
  h, w = bottom - top, right - left
  rows, cols = np.arange(h)[:, None], np.arange(w)[None, :]
  keep = np.ones((h, w), bool)
  # Each side is torn to a depth of border_depth * (1 + profile), profile in about [-1, 1].
  for side in range(4):
    length = w if side < 2 else h
    size = h if side < 2 else w
    depth = params.border_depth * size * (1 + midpoint_displacement(
        length, params.border_roughness, rng))
    depth = np.clip(depth, 0, size / 4)
    if side == 0:
      keep &= rows >= depth[None, :]
    elif side == 1:
      keep &= rows < h - depth[None, :]
    elif side == 2:
      keep &= cols >= depth[:, None]
    else:
      keep &= cols < w - depth[:, None]
  return (top, left, bottom, right), keep


def _shape_labels(keep, params, rng):
  """Random-shape pieces: components on either side of the mean crossing of a height map."""
  h, w = keep.shape
  height = diamond_square(h, w, params.ds_cells, params.ds_roughness, rng)
  # On the 0-255 scale the organisers used, a map spread over the whole range leaves ~15 % of
  # the page in the band around the mean; a larger spread keeps the cuts thin.
  inside = height[keep]
  height = (height - inside.mean()) * (params.ds_spread / max(inside.std(), 1e-9))
  # Above and below the mean are labelled apart, so pieces stay apart where the map is so
  # steep that no pixel falls inside the band.
  high, n_high = ndimage.label(keep & (height >= params.margin), _FOUR)
  low, _ = ndimage.label(keep & (height <= -params.margin), _FOUR)
  return np.where(low > 0, low + n_high, high)


def _wavy_cut(length, across, position, spacing, params, rng):
  """Mask [across, length] of one wavy cut at `position` along the `across` axis."""
  centre = position + params.wave_amplitude * spacing * midpoint_displacement(
      length, params.wave_roughness, rng)
  width = np.maximum(1.0, params.cut_width + params.cut_width_amplitude
                     * midpoint_displacement(length, params.wave_roughness, rng))
  # Each column's band spans the centres of it and its neighbour, so that neighbouring bands
  # overlap and no 4-connected path crosses the cut between them.
  following = np.append(centre[1:], centre[-1])
  low = np.minimum(centre, following) - width / 2
  high = np.maximum(centre, following) + width / 2
  rows = np.arange(across)[:, None]
  return (rows >= np.floor(low)[None, :]) & (rows <= np.ceil(high)[None, :])


def _rect_labels(keep, params, rng):
  """Rectangle-like pieces between wavy horizontal and vertical cuts."""
  h, w = keep.shape
  n_rows = rng.integers(params.rect_rows_min, params.rect_rows_max + 1)
  n_cols = rng.integers(params.rect_cols_min, params.rect_cols_max + 1)
  cut = np.zeros((h, w), bool)
  for i in range(1, n_rows):
    spacing = h / n_rows
    position = (i + rng.uniform(-0.15, 0.15)) * spacing
    cut |= _wavy_cut(w, h, position, spacing, params, rng)
  for j in range(1, n_cols):
    spacing = w / n_cols
    position = (j + rng.uniform(-0.15, 0.15)) * spacing
    cut |= _wavy_cut(h, w, position, spacing, params, rng).T
  labels, _ = ndimage.label(keep & ~cut, _FOUR)
  return labels


def _drop_small_and_fill(labels, min_area):
  """Keeps pieces of at least min_area, relabelled 1..n, each with its holes filled.

  The mean crossing of a fractal map leaves a few large pieces riddled with islands and cut
  bands; torn paper has no holes, so whatever one piece encloses and no kept piece owns goes
  to that piece. Smaller pieces fill first, so a piece inside another keeps its own holes.
  """
  area = np.bincount(labels.ravel())
  area[0] = 0
  kept = [i for i in np.argsort(area, kind='stable') if area[i] >= min_area]
  out = np.where(np.isin(labels, kept), labels, 0)
  boxes = ndimage.find_objects(labels)
  for index in kept:
    box = boxes[index - 1]
    filled = ndimage.binary_fill_holes(labels[box] == index, _FOUR)
    out[box][filled & (out[box] == 0)] = index
  # Dense labels in the original label order, so the piece order does not depend on area ties.
  lookup = np.zeros(len(area), labels.dtype)
  lookup[sorted(kept)] = np.arange(1, len(kept) + 1)
  return lookup[out]


def cut_page(page, rng, params, text_box=None):
  """Cuts one page into fragments.

  page: uint8 [H, W] or [H, W, 3]. text_box: (top, left, bottom, right) of the text; found
  from the ink when None. Returns a list of Piece, in a fixed order.
  """
  page = np.asarray(page)
  if page.dtype != np.uint8 or page.ndim not in (2, 3) or min(page.shape[:2]) < 8:
    raise ValueError(f'cut_page: expected a uint8 [H, W] or [H, W, 3] page of at least 8x8, '
                     f'got {page.dtype} {page.shape}')
  if text_box is None:
    text_box = find_text_box(page, params.ink_delta)
  top, left, bottom, right = text_box
  if not (0 <= top < bottom <= page.shape[0] and 0 <= left < right <= page.shape[1]):
    raise ValueError(f'cut_page: text box {text_box} is not inside the page {page.shape[:2]}')
  (top, left, bottom, right), keep = _cut_area(page.shape, text_box, params, rng)
  if rng.uniform() < params.rect_prob:
    labels = _rect_labels(keep, params, rng)
  else:
    labels = _shape_labels(keep, params, rng)
  min_area = params.min_share * (text_box[2] - text_box[0]) * (text_box[3] - text_box[1])
  labels = _drop_small_and_fill(labels, min_area)
  crop = page[top:bottom, left:right]
  pieces = []
  for index, box in enumerate(ndimage.find_objects(labels), start=1):
    mask = labels[box] == index
    image = crop[box].copy()
    image[~mask] = 0
    pieces.append(Piece(image, mask, (top + box[0].start, left + box[1].start)))
  return pieces


def parse_page_name(path):
  """(writer, page) from a page file named WID_PID.png / .jpg."""
  match = _PAGE_NAME.fullmatch(os.path.basename(path))
  if match is None:
    raise ValueError(f'{path}: expected a page image named WID_PID.png or WID_PID.jpg '
                     f'(integers)')
  return int(match.group(1)), int(match.group(2))


def save_fragments(out_dir, writer, page, pieces, quality):
  """Writes pieces as out_dir/WID_PID_FID.jpg, FID counting from 1; returns the paths."""
  paths = []
  for fid, (image, _, _) in enumerate(pieces, start=1):
    path = os.path.join(out_dir, f'{writer}_{page}_{fid}.jpg')
    Image.fromarray(image).save(path, quality=quality)
    paths.append(path)
  return paths


def _fragment_one(job):
  path, out_dir, params, seed = job
  writer, page = parse_page_name(path)
  try:
    with Image.open(path) as image:
      array = np.asarray(image.convert('RGB'))
  except OSError as e:
    raise ValueError(f'{path}: not a readable image: {e}') from e
  rng = np.random.default_rng([seed, writer, page])
  return len(save_fragments(out_dir, writer, page, cut_page(array, rng, params),
                            params.jpeg_quality))


def fragment_pages(pages_dir, out_dir, params, seed=0, workers=1):
  """Cuts every WID_PID.png/.jpg in pages_dir into out_dir; returns the fragment count.

  Each page's cuts depend only on (seed, WID, PID), not on the order or the worker count.
  """
  names = sorted(os.listdir(pages_dir))
  if not names:
    raise ValueError(f'{pages_dir}: no page images (expected WID_PID.png or WID_PID.jpg)')
  paths = [os.path.join(pages_dir, name) for name in names]
  seen = {}
  for path in paths:
    ids = parse_page_name(path)
    if ids in seen:  # both would write the same fragment names
      raise ValueError(f'{path}: same writer and page ids as {seen[ids]}')
    seen[ids] = path
  make_empty_dir(out_dir)
  jobs = [(path, out_dir, params, seed) for path in paths]
  with errors.on_ctrl_c(f'Interrupted (Ctrl-C) while cutting pages into {out_dir}: it holds '
                        'the fragments cut so far; empty it before rerunning.'):
    return sum(run_jobs(_fragment_one, jobs, workers, 'cutting pages into fragments', 'page'))


def make_empty_dir(path):
  """Creates path, or accepts it empty: files of an earlier run would mix into this one."""
  os.makedirs(path, exist_ok=True)
  if os.listdir(path):
    raise errors.NotEmpty(f'{path}: already holds files; expected a new or empty folder')


def run_jobs(fn, jobs, workers, what, unit):
  """[fn(job) for job in jobs] over `workers` processes, in order, with progress."""
  results = []
  with contextlib.ExitStack() as stack:
    progress = stack.enter_context(console.Progress(len(jobs), what, unit=unit))
    imap = (stack.enter_context(console.worker_pool(workers)).imap
            if workers > 1 else map)
    for result in imap(fn, jobs):
      results.append(result)
      progress.update()
  return results


def add_param_flags(parser):
  """One --flag per FragmentParams field, so the CLIs expose every knob."""
  for field in dataclasses.fields(FragmentParams):
    parser.add_argument('--' + field.name.replace('_', '-'), dest=field.name,
                        type=type(field.default), default=field.default)


def params_from_args(args):
  return FragmentParams(**{f.name: getattr(args, f.name)
                           for f in dataclasses.fields(FragmentParams)})


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--pages', required=True, help='folder of WID_PID.png / .jpg pages')
  parser.add_argument('--out', required=True, help='folder for WID_PID_FID.jpg fragments')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--workers', type=int, default=os.cpu_count())
  add_param_flags(parser)
  args = parser.parse_args(argv)
  count = fragment_pages(args.pages, args.out, params_from_args(args), args.seed, args.workers)
  print(f'wrote {count} fragments to {args.out}')


if __name__ == '__main__':
  errors.run_reporting(main)
