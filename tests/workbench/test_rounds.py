"""Rounds of candidate joins and searches through the app: the closest undecided pairs first,
decided pairs leave the queue and come back on undo, one image's round is its exact nearest,
a search by an item is retrieval/collections/search.py's."""
import io
import json
import os
import urllib.parse

import numpy as np
from PIL import Image

from retrieval.collections import index as index_lib, search
from workbench_helpers import collection, served, write_index  # noqa: F401 (fixtures)


def get(server, url):
  status, body = server.get(url)
  assert status == 200, body
  return json.loads(body)


def all_pairs(folder):
  """Every pair (i < j) of the index by distance, from the searcher's own nearest lists."""
  index = index_lib.load(os.path.join(folder, 'index.npz'))
  s = search.Searcher.of(index)
  n = len(s.descriptors)
  rows, dist = s.nearest(s.descriptors, s.lbp, n - 1, exclude=np.arange(n))
  pairs = {tuple(sorted((i, int(j)))): float(d) for i in range(n)
           for j, d in zip(rows[i], dist[i])}
  paths = index.entries.paths.tolist()
  return [(tuple(sorted((paths[i], paths[j]))), d) for (i, j), d in
          sorted(pairs.items(), key=lambda kv: kv[1])]


def pair_of(p):
  return tuple(sorted((p['a'], p['b'])))


def test_a_round_is_the_closest_undecided_pairs_and_undo_brings_one_back(served, collection):
  _, folder, _ = collection
  expected = all_pairs(folder)
  first = get(served, '/api/round?size=5')['pairs']
  assert [pair_of(p) for p in first] == [p for p, _ in expected[:5]]
  np.testing.assert_allclose([p['distance'] for p in first], [d for _, d in expected[:5]],
                             atol=1e-3)
  assert [p['rank'] for p in first] == [1, 2, 3, 4, 5]
  kept = []
  for p, verdict in zip(first[:3], ('same', 'different', 'unsure')):
    status, body = served.post('/api/decisions', json_body=dict(p, verdict=verdict,
                                                                 scholar='Ada'))
    assert status == 200, body
    kept.append(json.loads(body))
  assert (kept[0]['distance'], kept[0]['rank']) == (first[0]['distance'], 1)
  second = get(served, '/api/round?size=5')['pairs']
  assert [pair_of(p) for p in second] == [p for p, _ in expected[3:8]]
  assert [p['rank'] for p in second] == [4, 5, 6, 7, 8]  # where each stands in the whole list
  served.post(f'/api/decisions/{kept[1]["id"]}/undo')
  third = get(served, '/api/round?size=3')['pairs']
  assert [pair_of(p) for p in third] == [expected[1][0], expected[3][0], expected[4][0]]


def test_one_images_round_is_its_nearest_not_yet_decided_with_it(served, collection):
  _, folder, paths = collection
  anchor = paths[4]
  found = get(served, '/api/search?top=11&path=' + urllib.parse.quote(anchor))['matches']
  nearest = [m['path'] for m in found]
  assert anchor not in nearest and len(nearest) == 11
  expected = [(pair, d) for pair, d in all_pairs(folder) if anchor in pair]
  assert [tuple(sorted((anchor, p))) for p in nearest] == [p for p, _ in expected]
  served.post('/api/decisions', json_body=dict(a=anchor, b=nearest[0], verdict='different',
                                               scholar='Ada'))
  pairs = get(served, '/api/round?size=3&path=' + urllib.parse.quote(anchor))['pairs']
  assert [p['b'] for p in pairs] == nearest[1:4]
  assert [p['rank'] for p in pairs] == [2, 3, 4]


def test_the_collection_page_and_the_groups(served, collection):
  _, _, paths = collection
  listed = get(served, '/api/items?page=2&per=5')
  assert listed['total'] == len(paths) and listed['paths'] == paths[5:10]
  assert get(served, '/api/items?q=box1')['paths'] == [p for p in paths if 'box1' in p]
  for a, b in ((paths[0], paths[1]), (paths[1], paths[2])):
    served.post('/api/decisions', json_body=dict(a=a, b=b, verdict='same', scholar='Ada'))
  assert get(served, '/api/groups')['groups'] == [sorted(paths[:3])]


def test_paging_stops_at_either_end_and_a_bad_field_is_one_line(served, collection):
  _, _, paths = collection
  last = get(served, '/api/items?page=99&per=5')
  assert (last['page'], last['pages'], last['paths']) == (3, 3, paths[10:])
  assert get(served, '/api/items?page=0&per=5')['page'] == 1
  status, body = served.get('/api/items?page=two')
  assert status == 422 and json.loads(body)['error'] == '/api/items: page: Input should be ' \
      'a valid integer, unable to parse string as an integer'


def test_the_unsure_queue_and_the_counters_follow_each_decision(served):
  first = get(served, '/api/round?size=4')['pairs']
  assert all(p['of'] == 66 for p in first)  # 12 images: 66 pairs
  for p, verdict in zip(first, ('unsure', 'same', 'unsure', 'different')):
    served.post('/api/decisions', json_body=dict(p, verdict=verdict, scholar='Ada'))
  info = get(served, '/api/info')
  assert info['counts'] == dict(same=1, different=1, unsure=2) and info['decisions'] == 4
  queue = get(served, '/api/round?unsure=1')
  assert [pair_of(p) for p in queue['pairs']] == [pair_of(first[0]), pair_of(first[2])]
  assert queue['left'] == 2
  served.post('/api/decisions', json_body=dict(first[0], verdict='same', scholar='Ada'))
  assert [pair_of(p) for p in get(served, '/api/round?unsure=1')['pairs']] == [
      pair_of(first[2])]
  assert get(served, '/api/info')['counts'] == dict(same=2, different=1, unsure=1)


def test_a_rebuilt_index_is_served_without_a_restart(served, collection):
  root, folder, paths = collection
  assert get(served, '/api/info')['reloaded_at'] is None
  before = get(served, '/api/round?size=3')['pairs']
  rebuilt = write_index(root, folder, count=7, seed=1)
  info = get(served, '/api/info')
  assert info['images'] == 7 and info['reloaded_at']
  after = get(served, '/api/round?size=3')['pairs']
  assert {p for pair in after for p in (pair['a'], pair['b'])} <= set(rebuilt)
  assert after != before and after[0]['of'] == 21


def test_the_joining_tables_image_has_its_surround_transparent(served, collection):
  root, _, paths = collection
  pixels = np.zeros((40, 60, 3), np.uint8)  # black outside, as HisFrag20's
  pixels[10:30, 15:45] = 200
  Image.fromarray(pixels).save(os.path.join(root, paths[0]))
  url = '/image?path=' + urllib.parse.quote(paths[0])
  for query, corner in (('', 255), ('&cutout=1', 0)):
    status, body = served.get(url + query)
    assert status == 200
    alpha = np.asarray(Image.open(io.BytesIO(body)).convert('RGBA'))[..., 3]
    assert alpha[0, 0] == corner and alpha[20, 30] == 255
