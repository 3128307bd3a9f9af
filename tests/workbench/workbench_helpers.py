"""A small index over real image files, built without a model (random descriptors: what the
app does with them does not depend on where they came from), and the app served over it on
a free port in a thread of this process."""
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image

from conftest import CHROMIUM
from retrieval.collections import index as index_lib
from retrieval.features import pca

IMAGES = 12


def write_index(root, folder, count=IMAGES, seed=0, dpi=None):
  """`count` PNG fragments under root/box{k % 3}/ (at `dpi` when given: image k at
  dpi * (1 + k % 2), so that two resolutions meet) and their index in `folder`."""
  rng = np.random.default_rng(seed)
  paths = []
  for k in range(count):
    path = f'box{k % 3}/frag {k}.png'
    os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
    pixels = rng.integers(0, 255, (40 + 3 * k, 60, 3), dtype=np.uint8)
    kw = dict(dpi=(dpi * (1 + k % 2),) * 2) if dpi else {}
    Image.fromarray(pixels).save(os.path.join(root, path), **kw)
    paths.append(path)
  index_files(root, folder, paths, rng)
  return paths


def index_files(root, folder, paths, rng=None):
  """An index in `folder` of the image files `paths` (relative to `root`), with random
  descriptors."""
  rng = rng or np.random.default_rng(0)
  count = len(paths)
  stats = [os.stat(os.path.join(root, p)) for p in paths]
  x = pca.l2_normalise(rng.normal(size=(count, 8)).astype(np.float32))
  entries = index_lib.Entries(np.array(paths, str),
                              np.array([s.st_size for s in stats], np.int64),
                              np.array([s.st_mtime_ns for s in stats], np.int64), x,
                              np.zeros((count, 0), np.float32))
  settings = dict(power=0.5, whitening_dims=0, rerank_k=0, fusion_weight=0.0)
  header = dict(layout=index_lib.LAYOUT, step=7, checkpoint='0123456789abcdef',
                settings=settings, chosen_on='the test', fingerprint='test', config='{}',
                root=os.path.abspath(root))
  os.makedirs(folder, exist_ok=True)
  index_lib.save(os.path.join(folder, 'index.npz'), index_lib.Index(header, entries, None))


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class Served:
  """The app on 127.0.0.1:port in a daemon thread; get/post return (status, body)."""

  def __init__(self, settings):
    import uvicorn
    from retrieval.collections.workbench import app as app_lib
    self.app = app_lib.create(settings)
    self.port = free_port()
    self.server = uvicorn.Server(uvicorn.Config(self.app, host='127.0.0.1', port=self.port,
                                                log_level='warning'))
    self.thread = threading.Thread(target=self.server.run, daemon=True)
    self.thread.start()
    while not self.server.started:
      time.sleep(0.01)

  def request(self, method, url, data=None, headers=None, json_body=None, own_header=True):
    """own_header: a POST carries X-Workbench, as the page's do."""
    mine = {'X-Workbench': '1'} if method == 'POST' and own_header else {}
    headers = dict(mine, **(headers or {}))
    if json_body is not None:
      data = json.dumps(json_body).encode()
      headers['Content-Type'] = 'application/json'
    request = urllib.request.Request(f'http://127.0.0.1:{self.port}{url}', data=data,
                                     headers=headers, method=method)
    try:
      with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.read()
    except urllib.error.HTTPError as e:
      return e.code, e.read()

  def get(self, url, **kw):
    return self.request('GET', url, **kw)

  def post(self, url, **kw):
    return self.request('POST', url, **kw)

  def stop(self):
    self.server.should_exit = True
    self.thread.join(10)


@pytest.fixture
def collection(tmp_path):
  """(root, index folder, paths) of a fresh small index."""
  root, folder = tmp_path / 'images', tmp_path / 'index'
  return str(root), str(folder), write_index(str(root), str(folder))


@pytest.fixture
def served(collection, tmp_path):
  from retrieval.collections.workbench import app as app_lib
  root, folder, _ = collection
  settings = app_lib.Settings(workdir=str(tmp_path / 'workdir'), folder=folder,
                              db=str(tmp_path / 'decisions.sqlite'), candidates=40)
  server = Served(settings)
  yield server
  server.stop()


@pytest.fixture(scope='module')
def browser():
  """Debian's chromium, not a downloaded one; as root it needs --no-sandbox."""
  from playwright.sync_api import sync_playwright
  with sync_playwright() as p:
    b = p.chromium.launch(executable_path=CHROMIUM, args=['--no-sandbox'])
    yield b
    b.close()
