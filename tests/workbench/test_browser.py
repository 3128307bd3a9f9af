"""The workbench in a real browser: headless Chromium (Debian's, driven by
Playwright) over an index built by launch.index with a trained checkpoint, served by
launch.serve in its own process.

WORKBENCH_SCREENSHOTS=DIR also keeps the page's screenshots there (docs/images/ holds the
README's: WORKBENCH_SCREENSHOTS=docs/images pytest -m slow tests/workbench/test_browser.py).
"""
import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from conftest import ROOT, needs_chromium, run_module
from workbench_helpers import browser  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, needs_chromium]
CONFIG = '--config=configs/fragments.py:test'


@pytest.fixture(scope='module')
def built(fragment_evaluated, fragment_data, tmp_path_factory):
  """(workdir, index folder, collection) of the test writers' fragments, indexed beside the
  workdir (tests/retrieval's index of it stays as it is)."""
  folder = str(tmp_path_factory.mktemp('workbench') / 'index')
  collection = os.path.join(fragment_data, 'test')
  run_module('launch.index', CONFIG, '--workdir', fragment_evaluated, '--collection',
             collection, '--index', folder)
  return fragment_evaluated, folder, collection


class Server:
  """launch.serve in its own process; start() again after kill() reuses the database."""

  def __init__(self, built, db):
    self.workdir, self.folder, _ = built
    self.db, self.process = db, None

  def start(self):
    self.process = subprocess.Popen(
        [sys.executable, '-m', 'launch.serve', '--workdir', self.workdir, '--index',
         self.folder, '--db', self.db, '--port', '0', '--round', '8'], cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu'), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    for line in self.process.stdout:
      if line.startswith('Open '):
        self.address = line.split()[1]
        return self.address
    raise AssertionError(f'launch.serve ended {self.process.wait()}: '
                         f'{self.process.stderr.read()[-3000:]}')

  def kill(self):
    self.process.send_signal(signal.SIGKILL)  # no shutdown, no flush: as a crash
    self.process.wait()


@pytest.fixture
def server(built, tmp_path):
  s = Server(built, str(tmp_path / 'decisions.sqlite'))
  s.start()
  yield s
  if s.process.poll() is None:
    s.kill()


def open_page(browser, address, scholar, errors):
  context = browser.new_context(viewport={'width': 1280, 'height': 900}, accept_downloads=True)
  page = context.new_page()
  page.on('pageerror', lambda e: errors.append(str(e)))
  page.on('console', lambda m: m.type == 'error' and errors.append(m.text))
  page.goto(address)
  page.wait_for_selector('body[data-ready="1"]')
  page.fill('#scholar', scholar)
  page.dispatch_event('#scholar', 'change')
  return page


def decide(page, card, verdict, note=''):
  """Decides the card's pair; returns the decision's id once the app acknowledged it."""
  if note:
    card.locator('.note').fill(note)
  card.locator(f'.{verdict}').click()
  card.locator('.outcome .undo').wait_for()
  return int(card.get_attribute('data-decision'))


def standing(db):
  with sqlite3.connect(db) as raw:
    return {r[0]: r[1:] for r in raw.execute(
        'SELECT id, a, b, verdict, scholar FROM decisions WHERE undone_at IS NULL')}


def shoot(page, name):
  folder = os.environ.get('WORKBENCH_SCREENSHOTS')
  if folder:
    page.screenshot(path=os.path.join(ROOT, folder, name))


def test_search_decide_undo_reload_export_import(browser, server, built, tmp_path):
  _, _, collection = built
  errors = []
  page = open_page(browser, server.address, 'Ada', errors)
  cards = page.locator('.pair')
  assert cards.count() == 8
  page.wait_for_function("[...document.querySelectorAll('.view img')].slice(0, 4)"
                         ".every(i => i.complete && i.naturalWidth > 0)")
  # One common scale: each image drawn at the same fraction of its pixels.
  scales = page.evaluate("[...document.querySelectorAll('.pair')[0].querySelectorAll('.view img')]"
                         ".map(i => i.getBoundingClientRect().width / i.naturalWidth)")
  assert abs(scales[0] - scales[1]) < 1e-3, scales
  shoot(page, 'workbench-joins.png')
  cards.nth(0).locator('.to-table').click()  # the first pair on the joining table
  page.wait_for_function("(JSON.parse(document.querySelector('#table').dataset.state || '{}')"
                         ".items || []).length === 2")
  page.keyboard.press('e')
  page.wait_for_timeout(500)  # the canvas drawn
  shoot(page, 'workbench-table.png')
  page.keyboard.press('Escape')

  # Search by an item of the collection, then by an uploaded image.
  page.click('#tab-collection')
  page.locator('#thumbs figure img').first.click()
  page.wait_for_selector('#results figure')
  assert page.locator('#results figure').count() == 20
  page.set_input_files('#upload', os.path.join(collection, sorted(os.listdir(collection))[0]))
  page.wait_for_selector('#query figcaption:has-text("(yours)")', timeout=120_000)
  page.wait_for_selector('#status:has-text("nearest of")')
  shoot(page, 'workbench-search.png')

  # Three decisions, one undone.
  page.click('#tab-joins')
  pairs = [(cards.nth(k).get_attribute('data-a'), cards.nth(k).get_attribute('data-b'))
           for k in range(4)]
  ids = [decide(page, cards.nth(k), v, note) for k, (v, note) in
         enumerate([('same', 'same ductus'), ('different', ''), ('unsure', 'faded')])]
  cards.nth(1).locator('.outcome .undo').click()
  page.wait_for_selector('#status:has-text("undone")')
  page.reload()
  page.wait_for_selector('body[data-ready="1"]')
  shown = [(cards.nth(k).get_attribute('data-a'), cards.nth(k).get_attribute('data-b'))
           for k in range(cards.count())]
  assert pairs[0] not in shown and pairs[2] not in shown  # decided: out of the queue
  assert shown[:2] == [pairs[1], pairs[3]]  # the undone pair is back, in its place
  page.click('#tab-decisions')
  rows = page.locator('#decision-list tr.decision')
  rows.first.wait_for()
  assert sorted(rows.nth(k).locator('.verdict').inner_text() for k in range(rows.count())) == \
      ['same', 'unsure']
  assert set(standing(server.db)) == {ids[0], ids[2]}
  shoot(page, 'workbench-decisions.png')

  # Export, then import it back (all already here) and a colleague's that disagrees once.
  with page.expect_download() as download:
    page.click('#export-csv')
  exported = tmp_path / 'decisions.csv'
  download.value.save_as(exported)
  with page.expect_download() as download:
    page.click('#export-jsonld')
  download.value.save_as(tmp_path / 'decisions.jsonld')
  page.set_input_files('#import-file', exported)
  page.wait_for_selector('#import-result:has-text("0 added, 3 already here, 0 undone as there; '
                         '0 verdicts changed, 0 pairs with dissent")')
  page.set_input_files('#import-file', tmp_path / 'decisions.jsonld')
  page.wait_for_selector('#import-result:has-text("0 added, 3 already here")')
  # A colleague's, decided later: agreeing on the first pair, not on the third.
  theirs = list(csv.DictReader(io.StringIO(exported.read_text())))
  assert [row['status'] for row in theirs] == ['standing', 'undone', 'standing']
  for k, row in enumerate(theirs):
    row.update(uuid=f'ben-{k}', scholar='Ben', decided_at=f'2099-01-01T00:00:0{k}+00:00',
               verdict='different' if k == 2 else row['verdict'])
  colleague = tmp_path / 'ben.csv'
  with open(colleague, 'w', newline='') as f:
    writer = csv.DictWriter(f, theirs[0].keys())
    writer.writeheader()
    writer.writerows(theirs)
  page.set_input_files('#import-file', colleague)
  page.wait_for_selector('#import-result:has-text("3 added, 0 already here, 0 undone as there; '
                         '1 verdicts changed, 1 pairs with dissent")')
  assert 'dissent: unsure (Ada)' in page.inner_text('#import-result .dissent')
  # Ben's decisions join each pair's history; the newest stands, Ada's dissent is kept.
  kept = standing(server.db).values()
  assert len(kept) == 4 and {(a, b) for a, b, _, _ in kept} == {pairs[0], pairs[2]}
  page.wait_for_selector('#decision-list td.dissent:has-text("unsure (Ada)")')
  page.click('#tab-groups')
  page.wait_for_selector('.group')
  assert page.locator('.group figure').count() == 2
  assert errors == [], errors


def test_two_scholars_decide_at_once_and_nothing_is_lost(browser, server):
  errors = []
  pages = [open_page(browser, server.address, name, errors) for name in ('Ada', 'Ben')]
  # Both see the same round; each clicks through it without waiting for the answers, so
  # their requests overlap, and both decide the first pair too.
  for k in range(8):
    for who, (p, verdict) in enumerate(zip(pages, ('same', 'different'))):
      if k in (0, 1) or k % 2 == who:
        p.locator('.pair').nth(k).locator(f'.{verdict}').click(no_wait_after=True)
  acknowledged = []
  for p in pages:
    p.wait_for_function("document.querySelectorAll('.pair[data-decision]').length === 5")
    acknowledged += [int(x) for x in p.eval_on_selector_all(
        '.pair[data-decision]', 'cards => cards.map(c => c.dataset.decision)')]
  kept = standing(server.db)
  assert sorted(kept) == sorted(acknowledged) and len(kept) == 10
  assert sorted(v[3] for v in kept.values()).count('Ben') == 5
  assert errors == [], errors


def test_every_acknowledged_decision_survives_a_kill_during_a_round(browser, server):
  errors = []
  page = open_page(browser, server.address, 'Ada', errors)
  cards = page.locator('.pair')
  acknowledged = [decide(page, cards.nth(k), 'same') for k in range(3)]
  for k in range(3, 8):  # in flight when the server dies
    cards.nth(k).locator('.different').click(no_wait_after=True)
  server.kill()
  acknowledged += [int(x) for x in page.eval_on_selector_all(
      '.pair[data-decision]', 'cards => cards.map(c => c.dataset.decision)') if int(x) not in
      acknowledged]
  address = server.start()
  assert set(acknowledged) <= set(standing(server.db))
  page.goto(address)
  page.wait_for_selector('body[data-ready="1"]')
  page.click('#tab-decisions')
  page.locator('#decision-list tr.decision').first.wait_for()
  shown = page.eval_on_selector_all('#decision-list tr.decision', 'rows => rows.map(r => '
                                    'Number(r.dataset.id))')
  assert set(acknowledged) <= set(shown)
  # What the page had not been told stays off it as a decision, or is there whole.
  assert [e for e in errors if 'Failed to fetch' not in e and 'ERR_' not in e] == []


def test_a_iiif_manifest_indexed_served_and_exported_with_canvas_targets(browser, built,
                                                                         tmp_path):
  from test_iiif import ImageServer
  workdir, _, _ = built
  images = ImageServer(tmp_path, count=4)
  index = str(tmp_path / 'index')
  try:  # one command: the manifest's images fetched into the workdir, then indexed
    run_module('launch.index', CONFIG, '--workdir', workdir, '--manifest',
               f'{images.base}/m3.json', '--iiif_size', 300, '--index', index)
  finally:
    images.stop()
  server = Server((workdir, index, None), str(tmp_path / 'decisions.sqlite'))
  server.start()
  try:
    errors = []
    page = open_page(browser, server.address, 'Ada', errors)
    first = page.locator('.pair').first
    assert 'T-S 10J1.' in first.locator('.names').inner_text()
    first.locator('.same').click()
    first.locator('.outcome .undo').wait_for()
    page.click('#tab-decisions')
    with page.expect_download() as download:
      page.click('#export-jsonld')
    exported = json.loads(open(download.value.path()).read())
    assert exported['bg:collection'] == f'{images.base}/m3.json'
    targets = exported['first']['items'][0]['target']
    assert all(t['source']['id'].startswith(f'{images.base}/canvas/') and
               t['bg:shelfmark'].startswith('T-S 10J1.') for t in targets)
    assert errors == [], errors
  finally:
    server.kill()
