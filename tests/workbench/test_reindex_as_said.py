"""What the search and the workbench say when the collection changed under its index, followed
as written: rerunning launch.index on the collection's folder gets past each refusal."""
import json
import os
import shutil
import urllib.parse

import pytest

from conftest import run_module
from retrieval.collections.workbench import app as app_lib

from workbench_helpers import Served


@pytest.fixture
def indexed(fragment_evaluated, fragment_data, tmp_path):
  """(workdir, collection folder, index folder): 8 test fragments indexed with a trained
  fragments workdir, the index kept apart from it (--index)."""
  folder, index = tmp_path / 'images', tmp_path / 'index'
  folder.mkdir()
  for name in sorted(os.listdir(os.path.join(fragment_data, 'test')))[:8]:
    shutil.copy(os.path.join(fragment_data, 'test', name), folder / name)
  reindex(fragment_evaluated, folder, index)
  return fragment_evaluated, folder, index


def reindex(workdir, folder, index):
  """The command the messages name, run on the collection's folder."""
  result = run_module('launch.index', '--workdir', workdir, '--collection', folder, '--index',
                      index)
  return result.stdout + result.stderr


def search(workdir, index, check=True):
  return run_module('launch.search', '--workdir', workdir, '--index', index,
                    '--query-collection', check=check)


@pytest.mark.slow  # four index builds and four searches (launch.index compiles the model)
def test_a_search_over_a_removed_image_or_a_damaged_index_runs_after_reindexing(indexed):
  workdir, folder, index = indexed
  os.remove(folder / sorted(os.listdir(folder))[0])
  refused = search(workdir, index, check=False)
  assert refused.returncode == 1, refused.stdout[-2000:]
  assert 'rerun python -m launch.index on its folder' in refused.stderr, refused.stderr
  reindex(workdir, folder, index)
  assert 'Page:' in search(workdir, index).stdout

  (index / 'index.npz').write_bytes(b'PK\x03\x04 not an index any more')
  refused = search(workdir, index, check=False)
  assert refused.returncode == 1
  assert 'rebuild it with python -m launch.index' in refused.stderr, refused.stderr
  assert 'rebuilding it whole' in reindex(workdir, folder, index)
  assert 'Page:' in search(workdir, index).stdout


def message(body):
  return json.loads(body)['error']


@pytest.mark.slow  # two index builds
def test_a_changed_or_unreadable_image_is_decided_on_after_reindexing(indexed, tmp_path):
  workdir, folder, index = indexed
  settings = app_lib.Settings(workdir=str(workdir), folder=str(index),
                              db=str(tmp_path / 'decisions.sqlite'), candidates=40)
  server = Served(settings)
  try:
    pair = json.loads(server.get('/api/round?size=1')[1])['pairs'][0]
    with open(folder / pair['b'], 'ab') as f:
      f.write(b'\0')  # rescanned: the same image, another file
    decision = dict(pair, verdict='same', scholar='Ada')
    status, body = server.post('/api/decisions', json_body=decision)
    assert status == 409, body
    assert 'rerun python -m launch.index, then decide on what it shows now' in message(body)
    garbled = next(p for p in sorted(os.listdir(folder)) if p not in (pair['a'], pair['b']))
    (folder / garbled).write_bytes(b'\xff\xd8 no longer a JPEG')
    for request in ('/image?path=', '/api/image-info?path='):
      status, body = server.get(request + urllib.parse.quote(garbled))
      assert status == 410 and 'rerun python -m launch.index on its folder' in message(body)
  finally:
    server.stop()
  said = reindex(workdir, folder, index)
  assert garbled in said  # named as unreadable, and left out of the index
  server = Served(settings)
  try:
    status, body = server.post('/api/decisions', json_body=decision)
    assert status == 200, body
    shown = json.loads(server.get('/api/round?size=20')[1])['pairs']
    assert shown and garbled not in {p[k] for p in shown for k in ('a', 'b')}
    assert server.get('/image?path=' + urllib.parse.quote(garbled))[0] == 404
  finally:
    server.stop()
