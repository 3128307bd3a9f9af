"""The workbench's page as a scholar works it, in headless Chromium (Debian's, driven by
Playwright), over a small index of real image files with made-up descriptors
(workbench_helpers): what the page does does not depend on where the distances came from,
so these run in seconds where tests/workbench/test_browser.py trains a model first.

  a round worked by the keyboard alone, with its progress and counters;
  a merge round trip between two workbenches, through their pages' export and import;
  the joining table: drag, rotate, invert, one physical scale, a decision from it;
  a search hit decided, paging that stops.

The guide's screenshots are test_browser.py's, of real fragments.
"""
import json
import sqlite3

import pytest

from conftest import needs_chromium
from workbench_helpers import Served, browser, write_index  # noqa: F401 (a fixture)

pytestmark = needs_chromium
ROUND = 8


@pytest.fixture
def bench(tmp_path):
  """serve(name): the app over one index (images at 300 and 600 dpi), its own database."""
  from retrieval.collections.workbench import app as app_lib
  root, folder = str(tmp_path / 'images'), str(tmp_path / 'index')
  paths = write_index(root, folder, dpi=300)
  servers = []

  def serve(name):
    settings = app_lib.Settings(workdir=str(tmp_path / 'workdir'), folder=folder,
                                db=str(tmp_path / f'{name}.sqlite'), round_size=ROUND,
                                candidates=40)
    servers.append(Served(settings))
    return servers[-1]

  serve.paths = paths
  yield serve
  for s in servers:
    s.stop()


def open_page(browser, server, scholar, errors):
  context = browser.new_context(viewport={'width': 1280, 'height': 900}, accept_downloads=True)
  page = context.new_page()
  page.on('pageerror', lambda e: errors.append(str(e)))
  page.on('console', lambda m: m.type == 'error' and errors.append(m.text))
  page.goto(f'http://127.0.0.1:{server.port}/')
  page.wait_for_selector('body[data-ready="1"]')
  page.fill('#scholar', scholar)
  page.dispatch_event('#scholar', 'change')
  page.locator('body').click(position={'x': 5, 'y': 5})  # the keys go to the page
  return page


def standing(server):
  with sqlite3.connect(server.app.state.workbench.settings.db) as raw:
    rows = raw.execute('SELECT a, b, verdict, scholar, decided_at FROM decisions WHERE '
                       'undone_at IS NULL ORDER BY decided_at, uuid').fetchall()
  return {(a, b): (v, s) for a, b, v, s, _ in rows}  # the newest wins


def api(server, url):
  status, body = server.get(url)
  assert status == 200, body
  return json.loads(body)


def test_a_round_worked_by_the_keyboard_alone(browser, bench):
  server, errors = bench('ada'), []
  page = open_page(browser, server, 'Ada', errors)
  assert 'S same hand' in page.inner_text('#keys')
  cards = page.locator('.pair')
  assert cards.count() == ROUND
  assert page.inner_text('#progress') == f'1 of {ROUND} (0 decided)'
  assert 'closest pair 1 of 66 (top 2%)' in cards.nth(0).inner_text()
  assert page.locator('.pair.current .viewer').count() == 1  # one pair in the viewer
  pairs = [tuple(sorted((cards.nth(k).get_attribute('data-a'),
                         cards.nth(k).get_attribute('data-b')))) for k in range(ROUND)]
  for key, done in (('s', 1), ('d', 2), ('u', 3)):
    page.keyboard.press(key)
    page.wait_for_selector(f'#progress:has-text("({done} decided)")')
  assert page.inner_text('#progress') == f'4 of {ROUND} (3 decided)'
  page.wait_for_selector('#counts:has-text("3 pairs decided: 1 same hand, 1 different, '
                         '1 unsure")')
  # The viewer's invert is greyscale, then inverted: parchment turns grey, not navy.
  page.locator('.pair.current .view .tools button:has-text("invert")').first.click()
  assert 'grayscale(1) invert(1)' in page.locator('.pair.current .view img').first.evaluate(
      'img => img.style.filter')
  page.locator('body').click(position={'x': 5, 'y': 5})
  page.keyboard.press('n')  # the fifth, undecided
  page.keyboard.press('s')
  page.wait_for_selector('#progress:has-text("(4 decided)")')
  page.keyboard.press('z')  # the last decision undone: the fifth is undecided again
  page.wait_for_selector('#progress:has-text("(3 decided)")')
  assert page.inner_text('#progress').startswith('5 of')
  page.keyboard.press('ArrowLeft')
  page.keyboard.press('ArrowLeft')
  page.keyboard.press('d')  # the third changes its mind: unsure -> different
  page.wait_for_selector('#counts:has-text("3 pairs decided: 1 same hand, 2 different, '
                         '0 unsure")')
  assert standing(server) == {pairs[0]: ('same', 'Ada'), pairs[1]: ('different', 'Ada'),
                              pairs[2]: ('different', 'Ada')}
  # A refused decision says why on the pair acted on, not off screen.
  page.fill('#scholar', '')
  page.locator('body').click(position={'x': 5, 'y': 5})
  page.keyboard.press('s')
  current = page.locator('.pair.current')
  current.locator('.outcome.error:has-text("Give your name")').wait_for()
  assert errors == [], errors


def test_two_workbenches_exchanging_exports_through_their_pages_converge(browser, bench,
                                                                        tmp_path):
  a, b = bench('ada'), bench('ben')
  errors = []
  pages = {a: open_page(browser, a, 'Ada', errors), b: open_page(browser, b, 'Ben', errors)}
  keys = {a: 'usdd', b: 'ddss'}  # Ada: unsure, same, different, different; Ben disagrees
  for server, typed in keys.items():
    for n, key in enumerate(typed, 1):
      pages[server].keyboard.press(key)
      pages[server].wait_for_selector(f'#progress:has-text("({n} decided)")')
  # Ada revisits her unsure pair from the queue and decides it: same hand.
  page = pages[a]
  page.click('#unsure-queue')
  page.wait_for_selector('#round-what:has-text("unsure")')
  assert page.locator('.pair').count() == 1
  page.keyboard.press('s')
  page.wait_for_selector('#unsure-queue:has-text("(0)")')

  def send(source, target, fmt, k):
    src, dst = pages[source], pages[target]
    src.click('#tab-decisions')
    with src.expect_download() as download:
      src.click(f'#export-{fmt}')
    path = tmp_path / f'{k}.{fmt}'
    download.value.save_as(path)
    dst.click('#tab-decisions')
    dst.set_input_files('#import-file', path)
    dst.wait_for_selector(f'#import-result:has-text("{path.name}:")')
    return dst.inner_text('#import-result')

  send(a, b, 'csv', 1)
  said = send(b, a, 'jsonld', 2)
  assert 'pairs with dissent' in said
  assert standing(a) == standing(b)
  assert api(a, '/api/groups') == api(b, '/api/groups')
  dissent = api(a, '/api/info')['dissent']
  assert dissent > 0 and dissent == api(b, '/api/info')['dissent']
  # The dissent is shown on the pair in the decisions list.
  pages[a].click('#tab-decisions')
  assert pages[a].locator('#decision-list td.dissent:not(:empty)').count() == dissent
  for k in range(2):  # again and again: nothing moves
    assert ' 0 added' in send(a, b, 'jsonld', 3 + 2 * k)
    assert ' 0 added' in send(b, a, 'csv', 4 + 2 * k)
    assert standing(a) == standing(b)
  assert errors == [], errors


def table_state(page):
  return json.loads(page.get_attribute('#table', 'data-state'))


def test_the_joining_table_drag_rotate_invert_and_decide(browser, bench):
  server, errors = bench('ada'), []
  page = open_page(browser, server, 'Ada', errors)
  first = page.locator('.pair').nth(0)
  a, b = first.get_attribute('data-a'), first.get_attribute('data-b')
  page.keyboard.press('t')
  page.wait_for_function("document.querySelector('#table').dataset.state && JSON.parse("
                         "document.querySelector('#table').dataset.state).items.length === 2")
  state = table_state(page)
  # One physical scale: each fragment's width on the table is its width in centimetres.
  infos = [api(server, f'/api/image-info?path={p.replace(" ", "%20")}') for p in (a, b)]
  assert all(round(i['ppcm'] * 2.54) in (300, 600) for i in infos)
  for item, info in zip(state['items'], infos):
    assert item['width'] == pytest.approx(info['width'] / info['ppcm'], rel=1e-6)
  assert 'one physical scale' in page.inner_text('#table-scale')
  # Drag the first fragment 120 px right and 40 down: it moves, the other stays.
  box = page.locator('#table-canvas').bounding_box()
  start = page.evaluate("""() => { const osd = document.querySelector('#table').osd;
    const c = osd.world.getItemAt(0).getBoundsNoRotate().getCenter();
    const p = osd.viewport.pixelFromPoint(c); return [p.x, p.y]; }""")
  x, y = box['x'] + start[0], box['y'] + start[1]
  page.mouse.move(x, y)
  page.mouse.down()
  for step in range(1, 7):
    page.mouse.move(x + 20 * step, y + 40 * step / 6)
  page.mouse.up()
  moved = table_state(page)
  per_pixel = page.evaluate("document.querySelector('#table').osd.viewport"
                            ".deltaPointsFromPixels(new OpenSeadragon.Point(1, 0)).x")
  assert moved['items'][0]['x'] - state['items'][0]['x'] == pytest.approx(120 * per_pixel,
                                                                           rel=0.05)
  assert moved['items'][0]['y'] > state['items'][0]['y']
  assert moved['items'][1] == state['items'][1]
  # Rotate the chosen fragment (the one dragged), then the other; invert.
  page.keyboard.press('e')
  page.keyboard.press('Shift+Q')
  page.keyboard.press('Tab')
  page.keyboard.press('r')
  page.keyboard.press('i')
  turned = table_state(page)
  assert [i['rotation'] for i in turned['items']] == [4, 90] and turned['inverted']
  assert page.evaluate("getComputedStyle(document.querySelector('#table-canvas canvas'))"
                       ".filter") == 'grayscale(1) invert(1)'
  page.keyboard.press('f')
  page.wait_for_function("document.fullscreenElement?.id === 'table'")
  page.keyboard.press('f')
  page.wait_for_function('document.fullscreenElement === null')
  page.keyboard.press('s')  # decided from the table
  page.wait_for_selector('#table-status:has-text("same (kept")')
  assert standing(server) == {tuple(sorted((a, b))): ('same', 'Ada')}
  page.keyboard.press('Escape')
  assert page.locator('#table').is_hidden()
  assert errors == [], errors


def test_a_search_hit_is_decided_there_and_paging_stops(browser, bench):
  server, errors = bench('ada'), []
  page = open_page(browser, server, 'Ada', errors)
  page.click('#tab-collection')
  page.wait_for_selector('#thumbs figure')
  assert page.is_disabled('#prev-page')
  assert page.inner_text('#page-what') == 'page 1 of 1 (12 images)'
  assert page.is_disabled('#next-page')
  query = bench.paths[0]
  page.locator(f'#thumbs figure[data-path="{query}"] img').click()
  page.wait_for_selector('#results figure')
  hit = page.locator('#results figure').nth(2)
  assert hit.locator('figcaption').inner_text().startswith('3 of 11: ')
  hit.locator('.different').click()
  hit.locator('.outcome:has-text("different (kept")').wait_for()
  other = hit.get_attribute('data-path')
  assert standing(server) == {tuple(sorted((query, other))): ('different', 'Ada')}
  page.wait_for_selector('#counts:has-text("1 pairs decided")')
  # One image's round: the image shown once, above its candidates.
  page.click('#tab-collection')
  page.locator(f'#thumbs figure[data-path="{query}"] .joins-for').click()
  page.wait_for_selector('#round-what:has-text("The nearest of")')
  assert page.locator('#anchor figure').count() == 1
  cards = page.locator('.pair')
  assert cards.count() == ROUND and page.locator('.pair .mini').count() == ROUND
  assert 'nearest 1 of 11' in cards.nth(0).inner_text()
  assert other not in [cards.nth(k).get_attribute('data-b') for k in range(ROUND)]  # decided
  assert errors == [], errors
