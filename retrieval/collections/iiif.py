"""A IIIF Presentation manifest (3.0 or 2.1, a file or a URL) as a collection: a folder of its
images, fetched once through the IIIF Image API at a chosen size, with the identifiers a
scholar cites them by.

  python -m retrieval.collections.iiif --manifest URL_OR_FILE --workdir W [--size 1500]
  python -m launch.index --workdir W --collection W/iiif/KEY   (the folder it printed)

The folder (W/iiif/KEY, KEY from the manifest's id and the size) holds one image a canvas,
identifiers.csv (each file's shelfmark, canvas IRI and resolution: collection.py reads it)
and collection.json (the manifest's id: the collection's stable identifier in exports). An
image already fetched is kept: a second run fetches only what is missing.

Each canvas's image is asked of its Image API service at `size` pixels on its longest side:
'w,' (level 1 or 2: the server scales it), or at level 0 (static files) the smallest of the
sizes its info.json lists that reaches `size`, or the largest, as 'w,h'; without a service, the
painting annotation's own image. A larger image is scaled down here. A canvas's physical
dimensions service (physicalScale, physicalUnits), when the manifest has one, gives the
image's resolution, for the joining table's one physical scale.

Manifests are read with piffle (Princeton CDH), which reads 2.1 and 3.0 alike.
"""
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from PIL import Image

from bengrapheme import console, errors, files
from retrieval.collections import collection

TIMEOUT = 60  # s a request: a IIIF server that says nothing for a minute is not answering
CM = {'mm': 0.1, 'cm': 1.0, 'in': 2.54}
PHYSDIM = 'http://iiif.io/api/annex/services/physdim'


def _get(url, what):
  """The bytes at `url` (http(s) or file), or a UserError naming what was fetched."""
  try:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
      return response.read()
  except (urllib.error.URLError, OSError, ValueError) as e:
    raise errors.UserError(f'{url}: {what} could not be fetched ({getattr(e, "reason", e)}); '
                           'check the address and the network, then run again (what was '
                           'fetched is kept)')


def _text(value):
  """A IIIF label as one string: 3.0's language map, 2.1's string or list of strings or
  {'@value'} objects."""
  if isinstance(value, dict):
    if '@value' in value:
      return str(value['@value'])
    value = next(iter(value.values()), '')
  if isinstance(value, list):
    return ' '.join(_text(v) for v in value[:1])
  return '' if value is None else str(value)


def _as_list(value):
  return value if isinstance(value, list) else [] if value is None else [value]


def _level(profile):
  """The Image API compliance level of a service's profile (2.1: a URL or a list whose first
  is one; 3.0: 'level0'..'level2')."""
  for p in _as_list(profile):
    if isinstance(p, str):
      found = re.search(r'level([012])', p)
      if found:
        return int(found.group(1))
  return 0  # nothing said: ask only for what a static server has


def load(source, cache):
  """The manifest at `source` (a file or a URL) as piffle reads it, its JSON kept in `cache`
  (a file path)."""
  if os.path.isfile(source):
    data = open(source, 'rb').read()
  elif urllib.parse.urlparse(source).scheme in ('http', 'https', 'file'):
    data = _get(source, 'the manifest')
  else:
    raise errors.UserError(f'--manifest {source}: no such file, nor a URL; expected a IIIF '
                           'Presentation manifest (3.0 or 2.1), a file or an http(s) URL')
  try:
    raw = json.loads(data)
  except ValueError as e:
    raise errors.UserError(f'{source}: not JSON ({e}); expected a IIIF Presentation manifest')
  kind = raw.get('type') or raw.get('@type') if isinstance(raw, dict) else None
  if kind not in ('Manifest', 'sc:Manifest'):
    raise errors.UserError(f'{source}: a {kind or type(raw).__name__}, not a Manifest; '
                           'expected a IIIF Presentation manifest (3.0 or 2.1)')
  os.makedirs(os.path.dirname(cache), exist_ok=True)
  with files.atomic_file(cache, 'wb') as f:
    f.write(data)
  from piffle import load_iiif
  with contextlib.redirect_stdout(io.StringIO()):  # piffle prints each optional field missing
    return load_iiif.load_iiif_presentation(cache)


def canvases(manifest):
  """[(canvas, painted image body as a dict)] of a 3.0 or 2.1 manifest, in order."""
  out = []
  if getattr(manifest, 'sequences', None):  # 2.1
    for sequence in manifest.sequences:
      for canvas in sequence.canvases:
        for image in getattr(canvas, 'images', None) or []:
          out.append((canvas, dict(image.resource)))
          break
    return out
  for canvas in manifest.items or []:  # 3.0
    for page in getattr(canvas, 'items', None) or []:
      bodies = [a.body for a in page.items or [] if a.motivation == 'painting']
      if bodies:
        body = _as_list(bodies[0])[0]
        out.append((canvas, dict(body.get('items', [body])[0]) if body.get('type') == 'Choice'
                    else dict(body)))
        break
  return out


def image_url(body, size):
  """The URL of the body's image at about `size` px on its longest side (module docstring)."""
  services = [s for s in _as_list(body.get('service')) if isinstance(s, dict) and
              (s.get('id') or s.get('@id'))]
  if not services:
    return body['id']
  service = services[0]
  base = (service.get('id') or service.get('@id')).rstrip('/')
  info = json.loads(_get(f'{base}/info.json', 'the image information'))
  width, height = int(info['width']), int(info['height'])
  from piffle.image import IIIFImageClient
  client = IIIFImageClient(*base.rsplit('/', 1))
  if _level(info.get('profile') or service.get('profile')) >= 1:
    scale = min(1.0, size / max(width, height))
    return str(client.size(width=max(1, round(width * scale))))
  sizes = sorted((int(s['width']), int(s['height'])) for s in info.get('sizes') or [])
  if not sizes:
    return body['id']
  w, h = next((s for s in sizes if max(s) >= size), sizes[-1])
  # Level 0 serves the listed sizes only, asked as 'w,h' (Image API 2.1 and 3.0 alike).
  return str(client.size(width=w, height=h))


def resolution(canvas, pixels_wide):
  """Pixels a centimetre of an image `pixels_wide` of the canvas, from the canvas's
  physical dimensions service; None without one."""
  for s in _as_list(getattr(canvas, 'service', None)):
    if isinstance(s, dict) and PHYSDIM in str(s.get('profile', '')) and s.get('physicalScale'):
      units = CM.get(str(s.get('physicalUnits', '')).lower())
      if units and canvas.width:
        return pixels_wide / (float(s['physicalScale']) * float(canvas.width) * units)
  return None


def fetch(source, workdir, size=1500):
  """The folder of `source`'s images at `size` (module docstring); returns its path."""
  if size < 16:
    raise errors.UserError(f'--size {size}: expected at least 16 (pixels on the longest side)')
  scratch = os.path.join(workdir, 'iiif', 'manifests',
                         hashlib.sha1(source.encode()).hexdigest()[:16] + '.json')
  manifest = load(source, scratch)
  ident = str(manifest.id)
  folder = os.path.join(workdir, 'iiif', hashlib.sha1(f'{ident} {size}'.encode())
                        .hexdigest()[:12])
  os.makedirs(folder, exist_ok=True)
  found = canvases(manifest)
  if not found:
    raise errors.UserError(f'{source}: a manifest without a painted image; expected canvases '
                           'with images')
  rows, fetched = [], 0
  for k, (canvas, body) in enumerate(found, 1):
    shelfmark = _text(canvas.label) or f'{_text(manifest.label)} {k}'
    safe = re.sub(r'[^A-Za-z0-9._-]+', '_', shelfmark).strip('_')[:60]
    name = f'{k:04d}-{safe}.png'
    path = os.path.join(folder, name)
    if not os.path.exists(path):
      data = _get(image_url(body, size), f'the image of canvas {canvas.id}')
      try:
        image = Image.open(io.BytesIO(data))
        image.load()
      except collection.ERRORS as e:
        raise errors.UserError(f'{canvas.id}: its image is not readable ({e}); expected a '
                               'JPEG, PNG or TIFF from the Image API')
      if max(image.size) > size:
        image.thumbnail((size, size), Image.Resampling.LANCZOS)
      with files.atomic_file(path, 'wb') as f:
        image.save(f, 'PNG')
      fetched += 1
    with Image.open(path) as image:
      ppcm = resolution(canvas, image.size[0])
    rows.append(dict(path=name, shelfmark=shelfmark, iri=str(canvas.id), xywh='',
                     ppcm='' if ppcm is None else f'{ppcm:.4f}'))
  with files.atomic_file(os.path.join(folder, collection.IDENTIFIERS), 'w') as f:
    writer = csv.DictWriter(f, collection.IDENTIFIER_COLUMNS, lineterminator='\n')
    writer.writeheader()
    writer.writerows(rows)
  with files.atomic_file(os.path.join(folder, collection.ABOUT), 'w') as f:
    json.dump(dict(id=ident, label=_text(manifest.label), manifest=source, size=size), f,
              indent=1)
  console.say(f'{len(rows)} images of {ident}: {fetched} fetched, {len(rows) - fetched} '
              f'already here, in {folder}')
  return folder


def main(argv):
  del argv
  folder = fetch(MANIFEST.value, WORKDIR.value, SIZE.value)
  console.show(f'Index it: python -m launch.index --workdir {WORKDIR.value} --collection '
               f'{folder}')


if __name__ == '__main__':
  from absl import flags
  from launch import cli
  MANIFEST = flags.DEFINE_string('manifest', None, 'A IIIF Presentation manifest (3.0 or '
                                 '2.1): a file or an http(s) URL.', required=True)
  WORKDIR = flags.DEFINE_string('workdir', None, 'The workdir: the images go to '
                                'WORKDIR/iiif/KEY.', required=True)
  SIZE = flags.DEFINE_integer('size', 1500, 'Pixels on the longest side of each image.')
  cli.run(main)
