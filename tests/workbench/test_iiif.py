"""Citable identifiers: a IIIF manifest (3.0 and 2.1, a file or a URL) fetched from an Image API
served on 127.0.0.1 into a collection folder, indexed, served with its shelfmarks, and
exported with its canvas IRIs; a folder with its own identifiers.csv, regions of a canvas
exported with an xywh selector; bad identifier files and manifests refused in one line."""
import csv
import http.server
import io
import json
import os
import re
import threading

import numpy as np
import pytest
from PIL import Image

from bengrapheme import errors
from retrieval.collections import collection, decisions as db_lib, iiif
from retrieval.collections.workbench import app as app_lib, exchange
from workbench_helpers import Served, index_files

SIZES = [(100, 75), (200, 150), (400, 300)]  # what the level 0 server has of each image


class ImageServer:
  """A IIIF Image API on 127.0.0.1: image k (400 x 300 px) at /iiif/img{k}; level 0 (static
  files: the SIZES listed, 3.0 'w,h') or level 1 (any 'w,', 2.1). Manifests at /m3.json and
  /m2.json. Every request is kept in `asked`."""

  def __init__(self, tmp_path, count=3):
    self.asked, self.images = [], {}
    rng = np.random.default_rng(0)
    for k in range(count):
      self.images[f'img{k}'] = Image.fromarray(rng.integers(40, 255, (300, 400, 3), np.uint8))
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def do_GET(self):
        server.asked.append(self.path)
        body, kind = server.answer(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header('Content-Type', kind)
        self.end_headers()
        self.wfile.write(body or b'not here')

    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.base = f'http://127.0.0.1:{self.httpd.server_address[1]}'
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

  def answer(self, path):
    if path in ('/m3.json', '/m2.json'):
      return json.dumps(manifest(self.base, path[2], len(self.images))).encode(), 'application/json'
    found = re.fullmatch(r'/iiif(\d)/(img\d)/(info\.json|full/([\d,]+)/0/default\.jpg)', path)
    if not found or found.group(2) not in self.images:
      return None, 'text/plain'
    version, image = found.group(1), self.images[found.group(2)]
    if found.group(3) == 'info.json':
      return json.dumps(info(self.base, version, found.group(2))).encode(), 'application/json'
    size = found.group(4)
    if version == '3':  # level 0: the listed sizes only, as 'w,h'
      if size not in [f'{w},{h}' for w, h in SIZES]:
        return None, 'text/plain'
      w, h = map(int, size.split(','))
    else:  # level 1: 'w,'
      w = int(size.rstrip(','))
      h = round(image.size[1] * w / image.size[0])
    out = io.BytesIO()
    image.resize((w, h)).save(out, 'JPEG', quality=95)
    return out.getvalue(), 'image/jpeg'

  def stop(self):
    self.httpd.shutdown()


def info(base, version, name):
  if version == '3':
    return {'@context': 'http://iiif.io/api/image/3/context.json', 'id': f'{base}/iiif3/{name}',
            'type': 'ImageService3', 'protocol': 'http://iiif.io/api/image', 'profile': 'level0',
            'width': 400, 'height': 300, 'sizes': [{'width': w, 'height': h} for w, h in SIZES]}
  return {'@context': 'http://iiif.io/api/image/2/context.json', '@id': f'{base}/iiif2/{name}',
          'protocol': 'http://iiif.io/api/image', 'width': 400, 'height': 300,
          'profile': ['http://iiif.io/api/image/2/level1.json']}


def manifest(base, version, count):
  """A Genizah box as a 3.0 or 2.1 manifest: canvas k is 'T-S 10J1.{k}' (400 x 300), the 3.0
  ones with a physical dimensions service (0.05 mm a canvas pixel: 200 px a cm)."""
  canvases = []
  for k in range(count):
    canvas, image = f'{base}/canvas/{k}', f'{base}/iiif{version}/img{k}'
    if version == '3':
      canvases.append({
          'id': canvas, 'type': 'Canvas', 'label': {'none': [f'T-S 10J1.{k}']},
          'width': 400, 'height': 300,
          'service': [{'@context': 'http://iiif.io/api/annex/services/physdim/1/context.json',
                       'profile': 'http://iiif.io/api/annex/services/physdim',
                       'physicalScale': 0.05, 'physicalUnits': 'mm'}],
          'items': [{'id': f'{canvas}/page', 'type': 'AnnotationPage', 'items': [{
              'id': f'{canvas}/painting', 'type': 'Annotation', 'motivation': 'painting',
              'target': canvas, 'body': {
                  'id': f'{image}/full/max/0/default.jpg', 'type': 'Image',
                  'format': 'image/jpeg', 'width': 400, 'height': 300,
                  'service': [{'id': image, 'type': 'ImageService3', 'profile': 'level0'}]}}]}]})
    else:
      canvases.append({
          '@id': canvas, '@type': 'sc:Canvas', 'label': f'T-S 10J1.{k}', 'width': 400,
          'height': 300, 'images': [{
              '@type': 'oa:Annotation', 'motivation': 'sc:painting', 'on': canvas,
              'resource': {'@id': f'{image}/full/full/0/default.jpg', '@type': 'dctypes:Image',
                           'service': {'@context': 'http://iiif.io/api/image/2/context.json',
                                       '@id': image,
                                       'profile': 'http://iiif.io/api/image/2/level1.json'}}}]})
  if version == '3':
    return {'@context': 'http://iiif.io/api/presentation/3/context.json',
            'id': f'{base}/m3.json', 'type': 'Manifest', 'label': {'en': ['T-S 10J1']},
            'items': canvases}
  return {'@context': 'http://iiif.io/api/presentation/2/context.json',
          '@id': f'{base}/m2.json', '@type': 'sc:Manifest', 'label': 'T-S 10J1',
          'sequences': [{'@type': 'sc:Sequence', 'canvases': canvases}]}


@pytest.fixture
def images(tmp_path):
  server = ImageServer(tmp_path)
  yield server
  server.stop()


def identifiers(folder):
  with open(os.path.join(folder, collection.IDENTIFIERS)) as f:
    return list(csv.DictReader(f))


def test_a_3_0_manifest_file_at_level_0_and_a_2_1_manifest_url_at_level_1(images, tmp_path):
  path = tmp_path / 'm3.json'
  path.write_text(json.dumps(manifest(images.base, '3', 3)))
  folder = iiif.fetch(str(path), str(tmp_path / 'workdir'), size=180)
  # Level 0: the smallest listed size that reaches 180 px, in 3.0's 'w,h'.
  assert sorted(p for p in images.asked if 'default' in p) == [
      f'/iiif3/img{k}/full/200,150/0/default.jpg' for k in range(3)]
  rows = identifiers(folder)
  assert [(r['shelfmark'], r['iri']) for r in rows] == [
      (f'T-S 10J1.{k}', f'{images.base}/canvas/{k}') for k in range(3)]
  for r in rows:
    with Image.open(os.path.join(folder, r['path'])) as image:
      assert image.size == (180, 135)  # scaled down here to the size asked
    # 200 px a cm on the 400 px canvas: 90 px a cm in the 180 px image.
    assert float(r['ppcm']) == pytest.approx(90)
  ident, known = collection.read_identifiers(folder)
  assert ident == f'{images.base}/m3.json' and known[rows[0]['path']].ppcm == pytest.approx(90)
  # Fetched once: a second run asks for the manifest's file only, no image.
  images.asked.clear()
  assert iiif.fetch(str(path), str(tmp_path / 'workdir'), size=180) == folder
  assert images.asked == []

  folder2 = iiif.fetch(f'{images.base}/m2.json', str(tmp_path / 'workdir'), size=250)
  assert [p for p in images.asked if 'default' in p] == [
      f'/iiif2/img{k}/full/250,/0/default.jpg' for k in range(3)]
  rows = identifiers(folder2)
  assert rows[1]['shelfmark'] == 'T-S 10J1.1' and rows[1]['ppcm'] == ''
  with Image.open(os.path.join(folder2, rows[1]['path'])) as image:
    assert image.size == (250, 188)


def test_a_iiif_collection_is_served_with_shelfmarks_and_exports_canvas_targets(images,
                                                                               tmp_path):
  folder = iiif.fetch(f'{images.base}/m3.json', str(tmp_path / 'workdir'), size=200)
  rows = identifiers(folder)
  index_files(folder, str(tmp_path / 'index'), [r['path'] for r in rows])
  server = Served(app_lib.Settings(workdir=str(tmp_path / 'workdir'),
                                   folder=str(tmp_path / 'index'),
                                   db=str(tmp_path / 'd.sqlite'), candidates=10))
  try:
    status, body = server.get('/api/shelfmarks')
    assert json.loads(body) == {r['path']: r['shelfmark'] for r in rows}
    info = json.loads(server.get('/api/info')[1])
    assert info['collection'] == f'{images.base}/m3.json' and info['identified'] == 3
    a, b = rows[0]['path'], rows[2]['path']
    status, body = server.post('/api/decisions', json_body=dict(a=a, b=b, verdict='same',
                                                                scholar='Ada', rank=1))
    assert status == 200, body
    table = json.loads(server.get(f'/api/image-info?path={a}')[1])
    assert table['ppcm'] == pytest.approx(100) and table['shelfmark'] == 'T-S 10J1.0'
    exported = json.loads(server.get('/api/export.jsonld')[1])
    assert exported['bg:collection'] == f'{images.base}/m3.json'
    assert exported['bg:checkpoint'] == '0123456789abcdef'
    targets = exported['first']['items'][0]['target']
    assert [t['source'] for t in targets] == [{'id': f'{images.base}/canvas/{k}',
                                               'type': 'Canvas'} for k in (0, 2)]
    assert [t['bg:shelfmark'] for t in targets] == ['T-S 10J1.0', 'T-S 10J1.2']
    assert 'selector' not in targets[0]  # a whole canvas
    row, = csv.DictReader(io.StringIO(server.get('/api/export.csv')[1].decode()))
    assert (row['a_shelfmark'], row['a_iri'], row['b_iri'], row['collection']) == (
        'T-S 10J1.0', f'{images.base}/canvas/0', f'{images.base}/canvas/2',
        f'{images.base}/m3.json')
    # A colleague's workbench reads it back onto the same files.
    other = db_lib.Decisions(str(tmp_path / 'other.sqlite'))
    exchange.merge(other, exchange.parse('x.jsonld', json.dumps(exported).encode()), 'import')
    assert list(other.standing()) == [tuple(sorted((a, b)))]
  finally:
    server.stop()


def test_a_folder_with_identifiers_exports_regions_of_canvases(tmp_path):
  root = tmp_path / 'box'
  root.mkdir()
  paths = []
  for k in range(3):
    paths.append(f'piece{k}.png')
    Image.fromarray(np.full((30, 40, 3), 120 + k, np.uint8)).save(root / paths[-1])
  (root / collection.IDENTIFIERS).write_text(
      'path,shelfmark,iri,xywh\n'
      'piece0.png,ENA 2739.1,https://example.org/canvas/7,"10,20,300,400"\n'
      'piece1.png,ENA 2739.2,https://example.org/canvas/7,"320,20,200,400"\n')
  ident, known = collection.read_identifiers(str(root))
  assert ident is None and known['piece1.png'].xywh == '320,20,200,400'
  d = db_lib.Decision(a='piece0.png', b='piece1.png', a_size=1, a_mtime_ns=2, b_size=3,
                      b_mtime_ns=4, verdict='same', note='', scholar='Ada', distance=None,
                      rank=None, checkpoint='c', decided_at=db_lib.now(), uuid='u')
  targets = json.loads(exchange.to_jsonld([d], 'x', known, 'file:///box'))['first'][
      'items'][0]['target']
  assert [t['selector']['value'] for t in targets] == ['xywh=10,20,300,400',
                                                        'xywh=320,20,200,400']
  assert targets[0]['source']['id'] == 'https://example.org/canvas/7'
  # A path the CSV does not name keeps its path as its target.
  d2 = db_lib.Decision(**{**d.__dict__, 'b': 'piece2.png'})
  assert json.loads(exchange.to_jsonld([d2], 'x', known))['first']['items'][0]['target'][1][
      'source'] == 'piece2.png'


@pytest.mark.parametrize('text, message', [
    ('path,shelfmark\npiece0.png,ENA 1\n', 'no column iri; expected a header path,shelfmark,iri'),
    ('path,shelfmark,iri\npiece0.png,,https://x\n', 'row 2: shelfmark empty'),
    ('path,shelfmark,iri,xywh\npiece0.png,A,https://x,"1,2"\n', "row 2: xywh '1,2'"),
    ('path,shelfmark,iri,ppcm\npiece0.png,A,https://x,-3\n', "row 2: ppcm '-3'"),
])
def test_a_bad_identifiers_file_is_one_line_naming_row_and_field(tmp_path, text, message):
  (tmp_path / collection.IDENTIFIERS).write_text(text)
  with pytest.raises(errors.UserError) as e:
    collection.read_identifiers(str(tmp_path))
  assert message in str(e.value) and '\n' not in str(e.value)
  assert str(e.value).startswith(str(tmp_path / collection.IDENTIFIERS))


def test_what_is_not_a_manifest_is_refused_in_one_line(images, tmp_path):
  page = tmp_path / 'page.json'
  page.write_text(json.dumps({'type': 'AnnotationPage', 'items': []}))
  for source, message in [(str(page), 'a AnnotationPage, not a Manifest'),
                          (str(tmp_path / 'none.json'), 'no such file, nor a URL'),
                          (f'{images.base}/missing.json', 'the manifest could not be fetched')]:
    with pytest.raises(errors.UserError) as e:
      iiif.fetch(source, str(tmp_path / 'workdir'))
    assert message in str(e.value) and '\n' not in str(e.value), str(e.value)
