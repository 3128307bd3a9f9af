"""Safe by default: only images of the index under its folder are served; an
upload that is not an image, too large, or a decompression bomb is refused in one message and
nothing is stored; a decision on a file changed since indexing is refused; beyond loopback an
access token is required; a POST from another site's form, or a Host that is not loopback, is
refused."""
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT
from retrieval.collections.workbench import app as app_lib

from workbench_helpers import Served, collection, free_port, served  # noqa: F401 (fixtures)


def url(path):
  return '/image?path=' + urllib.parse.quote(path)


def message(body):
  return json.loads(body)['error']


def test_only_indexed_images_under_the_root_are_served(served, collection, tmp_path):
  root, _, paths = collection
  status, body = served.get(url(paths[0]))
  assert status == 200 and Image.open(io.BytesIO(body)).size == (60, 40)
  secret = tmp_path / 'secret.png'
  Image.new('RGB', (5, 5)).save(secret)
  for path, status, words in [
      (f'../{secret.name}', 403, 'climbs out'),
      (f'box0/../../{secret.name}', 403, 'climbs out'),
      (str(secret), 403, 'absolute path'),
      ('/etc/passwd', 403, 'absolute path'),
      ('box0/not indexed.png', 404, 'not an image of the index')]:
    got, body = served.get(url(path))
    assert (got, words in message(body)) == (status, True), (path, body)
  # An indexed name that is now a link out of the folder: refused, though it is indexed.
  linked = os.path.join(root, paths[1])
  os.remove(linked)
  os.symlink(secret, linked)
  got, body = served.get(url(paths[1]))
  assert got == 403 and 'outside the indexed folder' in message(body)


def files_under(folder):
  """The files under `folder`, and the app's temporary query folders anywhere."""
  queries = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith('workbench-query-')]
  return sorted(os.path.join(d, n) for d, _, names in os.walk(folder) for n in names), queries


def bomb():
  """A PNG of 10,000 x 10,000 pixels in a few kilobytes."""
  out = io.BytesIO()
  Image.new('1', (10_000, 10_000)).save(out, 'PNG')
  return out.getvalue()


def test_bad_uploads_are_refused_in_one_message_and_nothing_is_stored(collection, tmp_path):
  root, folder, _ = collection
  settings = app_lib.Settings(workdir=str(tmp_path / 'workdir'), folder=folder,
                              db=str(tmp_path / 'decisions.sqlite'), candidates=40,
                              max_upload_bytes=200_000)
  server = Served(settings)
  before = files_under(tmp_path)
  try:
    small, photo = bomb(), io.BytesIO()
    assert len(small) < 200_000
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (90, 90, 3), np.uint8)).save(
        photo, 'PNG')
    for name, data, status, words in [
        ('notes.png', b'shelf marks, not an image', 415, 'not a readable image'),
        ('empty.png', b'', 415, 'empty'),
        ('big.png', os.urandom(300_000), 413, 'larger than the upload limit'),
        ('bomb.png', small, 413, 'decompression bomb'),
        ('cut.png', photo.getvalue()[:9000], 415, 'not a readable image'),
        ('anim.gif', gif(), 415, 'a GIF image')]:
      got, body = server.post('/api/search/upload?name=' + name, data=data)
      text = message(body)
      assert got == status and words in text and text.startswith(name), (name, text)
      assert '\n' not in text and ' object at 0x' not in text, text
    got, body = server.post('/api/import?name=big.csv', data=b'x' * 300_000)
    assert got == 413
  finally:
    server.stop()
  assert files_under(tmp_path) == before
  # A real photograph over the limit, then under the larger limit the message names.
  large = io.BytesIO()
  Image.fromarray(np.random.default_rng(1).integers(0, 255, (300, 300, 3), np.uint8)).save(
      large, 'PNG')
  assert large.tell() > 200_000
  # (Past the limit, the upload is embedded with the index's checkpoint: this synthetic index
  # has none, which is the next, other refusal.)
  for limit in (200_000, 2**20):  # --max_upload_mb 1
    server = Served(dataclasses.replace(settings, max_upload_bytes=limit))
    try:
      got, body = server.post('/api/search/upload?name=large.png', data=large.getvalue())
      assert (got == 413) == (limit == 200_000), body[:300]
      assert ('(launch.serve --max_upload_mb)' in message(body)) == (limit == 200_000)
    finally:
      server.stop()


def gif():
  out = io.BytesIO()
  Image.new('P', (4, 4)).save(out, 'GIF')
  return out.getvalue()


def test_a_decision_on_a_file_changed_since_indexing_is_refused(served, collection):
  root, _, paths = collection
  status, body = served.get('/api/round?size=1')
  pair = json.loads(body)['pairs'][0]
  with open(os.path.join(root, pair['b']), 'ab') as f:
    f.write(b'\0')  # a rescan replaced it
  status, body = served.post('/api/decisions', json_body=dict(pair, verdict='same',
                                                               scholar='Ada'))
  assert status == 409 and f'{pair["b"]} changed since it was indexed' in message(body)
  assert json.loads(served.get('/api/decisions')[1])['decisions'] == []
  os.remove(os.path.join(root, pair['b']))
  status, body = served.post('/api/decisions', json_body=dict(pair, verdict='same',
                                                               scholar='Ada'))
  assert status == 409 and 'removed' in message(body)


def test_a_post_without_the_header_and_a_foreign_host_are_refused(served):
  status, body = served.get('/api/round?size=1')
  pair = json.loads(body)['pairs'][0]
  decision = json.dumps(dict(pair, verdict='same', scholar='Ada')).encode()
  status, _ = served.request('POST', '/api/decisions', data=decision, own_header=False,
                             headers={'Content-Type': 'application/json'})
  assert status == 403  # another site's form cannot set X-Workbench
  status, body = served.get('/api/info', headers={'Host': 'evil.example:80'})
  assert status == 403 and b'loopback' in body
  assert json.loads(served.get('/api/decisions')[1])['decisions'] == []


def test_with_a_token_every_request_needs_it(collection, tmp_path):
  _, folder, _ = collection
  server = Served(app_lib.Settings(workdir=str(tmp_path), folder=folder,
                                   db=str(tmp_path / 'd.sqlite'), candidates=40,
                                   token='s3cret', loopback=False))
  try:
    assert server.get('/api/info')[0] == 403
    assert server.get('/api/info?token=wrong')[0] == 403
    request = urllib.request.Request(f'http://127.0.0.1:{server.port}/?token=s3cret')
    with urllib.request.urlopen(request) as response:
      cookie = response.headers['Set-Cookie'].split(';')[0]
      assert response.status == 200 and 'HttpOnly' in response.headers['Set-Cookie']
    assert server.get('/api/info', headers={'Cookie': cookie})[0] == 200
  finally:
    server.stop()


def serve(workdir, *args):
  return subprocess.Popen([sys.executable, '-m', 'launch.serve', '--workdir', workdir, *args],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu'),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def address(process):
  """The address launch.serve printed, once it is up."""
  for line in process.stdout:
    if line.startswith('Open '):
      return line.split()[1]
  raise AssertionError(f'launch.serve ended: {process.wait()} {process.stderr.read()[-2000:]}')


@pytest.mark.slow
def test_serve_beyond_loopback_prints_a_token_and_requires_it(collection, tmp_path):
  root, folder, _ = collection
  workdir = tmp_path / 'workdir'
  workdir.mkdir()
  os.symlink(folder, workdir / 'index')
  process = serve(str(workdir), '--host', '0.0.0.0', '--port', '0')
  try:
    shown = address(process)
    match = re.fullmatch(r'http://0\.0\.0\.0:(\d+)/\?token=([\w-]{20,})', shown)
    assert match, shown
    local = f'http://127.0.0.1:{match[1]}/api/info'
    with pytest.raises(urllib.error.HTTPError, match='403'):
      urllib.request.urlopen(local, timeout=30)
    with urllib.request.urlopen(f'{local}?token={match[2]}', timeout=30) as response:
      assert json.loads(response.read())['images'] == 12
    # The default binds loopback only, without a token; the same port again is one line.
    again = serve(str(workdir), '--port', match[1])
    _, err = again.communicate(timeout=120)
    assert again.returncode == 1 and err.strip().count('\n') == 0
    assert f'--port {match[1]}: cannot listen there' in err and 'pick another --port' in err
    other = serve(str(workdir), '--port', str(free_port()))  # as said
    try:
      assert address(other).startswith('http://127.0.0.1:')
    finally:
      other.kill()
      other.wait()
  finally:
    process.kill()
    process.wait()
  assert os.path.exists(workdir / 'decisions.sqlite')
