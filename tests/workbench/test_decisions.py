"""The decisions database and its exchange: one row a decision, undo, the schema version,
CSV and Web Annotation round trips, a colleague's import merged without overwriting, the
groups of 'same hand' pairs."""
import csv
import dataclasses
import io
import json
import sqlite3

import pytest

from bengrapheme import errors
from retrieval.collections import decisions as db_lib
from retrieval.collections.workbench import exchange


def decision(a, b, verdict='same', scholar='Ada', **kw):
  return db_lib.Decision(a=a, b=b, a_size=10, a_mtime_ns=11, b_size=20, b_mtime_ns=21,
                         verdict=verdict, note=kw.pop('note', ''), scholar=scholar,
                         distance=kw.pop('distance', 0.5), rank=kw.pop('rank', 3),
                         checkpoint='abc', **kw)


@pytest.fixture
def store(tmp_path):
  return db_lib.Decisions(str(tmp_path / 'decisions.sqlite'))


def test_a_decision_is_kept_with_all_it_was_shown_with_and_survives_a_reopening(store):
  kept = store.add(decision('z.png', 'a.png', note='ink alike', distance=-1.25, rank=4))
  again = db_lib.Decisions(store.path).all()
  assert again == [kept]
  d = again[0]
  # The pair is kept ordered by path, each file with its own size and time.
  assert (d.a, d.b, d.a_size, d.a_mtime_ns, d.b_size, d.b_mtime_ns) == (
      'a.png', 'z.png', 20, 21, 10, 11)
  assert (d.verdict, d.note, d.scholar, d.distance, d.rank, d.checkpoint) == (
      'same', 'ink alike', 'Ada', -1.25, 4, 'abc')
  assert d.decided_at and d.uuid and d.id == 1
  with sqlite3.connect(store.path) as raw:
    assert raw.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
    assert raw.execute('PRAGMA user_version').fetchone()[0] == db_lib.SCHEMA_VERSION


def test_undo_puts_the_pair_back_and_the_newest_decision_stands(store):
  first = store.add(decision('a', 'b', 'same'))
  second = store.add(decision('a', 'b', 'different', scholar='Ben'))
  assert store.standing()[('a', 'b')].verdict == 'different'
  store.undo(second.id)
  assert store.standing()[('a', 'b')].verdict == 'same'
  store.undo(first.id)
  assert store.standing() == {}
  assert len(store.all(undone=True)) == 2  # the history stays
  with pytest.raises(errors.UserError, match='already undone'):
    store.undo(first.id)
  with pytest.raises(errors.UserError, match='no such decision'):
    store.undo(99)


def test_bad_decisions_and_databases_are_one_line_errors(store, tmp_path):
  with pytest.raises(errors.UserError, match="verdict 'maybe'"):
    store.add(decision('a', 'b', 'maybe'))
  with pytest.raises(errors.UserError, match='scholar'):
    store.add(decision('a', 'b', scholar=' '))
  with sqlite3.connect(store.path) as raw:
    raw.execute(f'PRAGMA user_version = {db_lib.SCHEMA_VERSION + 1}')
  with pytest.raises(errors.UserError, match=f'schema version {db_lib.SCHEMA_VERSION + 1}'):
    db_lib.Decisions(store.path)
  other = tmp_path / 'other.sqlite'
  with sqlite3.connect(other) as raw:
    raw.execute('CREATE TABLE t (x)')
  with pytest.raises(errors.UserError, match='not a decisions database'):
    db_lib.Decisions(str(other))
  text = tmp_path / 'notes.txt'
  text.write_text('not a database at all, but long enough to be read as a header ' * 4)
  with pytest.raises(errors.UserError, match='not an SQLite database'):
    db_lib.Decisions(str(text))
  with pytest.raises(errors.UserError, match='does not exist'):
    db_lib.Decisions(str(tmp_path / 'no' / 'such.sqlite'))


def test_groups_join_same_hand_pairs_transitively(store):
  store.add(decision('a', 'b'))
  store.add(decision('b', 'c'))
  store.add(decision('x', 'y'))
  store.add(decision('c', 'x', 'different'))
  undone = store.add(decision('y', 'z'))
  store.undo(undone.id)
  store.add(decision('p', 'q', 'unsure'))
  assert db_lib.groups(store.standing()) == [['a', 'b', 'c'], ['x', 'y']]


@pytest.mark.parametrize('fmt', ['csv', 'jsonld'])
def test_export_then_import_elsewhere_gives_the_same_decisions(store, tmp_path, fmt):
  store.add(decision('a', 'b', note='comma, "quote"\nnew line', distance=None, rank=None))
  store.add(decision('c', 'd', 'unsure', scholar='Ben'))
  text = (exchange.to_csv(store.all(undone=True)) if fmt == 'csv' else
          exchange.to_jsonld(store.all(undone=True), 'test'))
  if fmt == 'jsonld':
    collection = json.loads(text)
    assert collection['type'] == 'AnnotationCollection'
    assert 'http://www.w3.org/ns/anno.jsonld' in collection['@context']
    first = collection['first']['items'][0]
    assert first['type'] == 'Annotation' and len(first['target']) == 2
  other = db_lib.Decisions(str(tmp_path / 'colleague.sqlite'))
  result = exchange.merge(other, exchange.parse(f'mine.{fmt}', text.encode()), 'import: x')
  assert (result['added'], result['already'], result['dissent']) == (2, 0, [])
  strip = lambda d: dataclasses.replace(d, id=None, origin='')
  assert [strip(d) for d in other.all()] == [strip(d) for d in store.all()]
  # Importing the same file again adds nothing.
  again = exchange.merge(other, exchange.parse(f'mine.{fmt}', text.encode()), 'import: x')
  assert again == dict(added=0, already=2, undone=0, changed=[], dissent=[])


def test_an_import_keeps_a_colleagues_dissent_and_the_newest_decision_stands(store, tmp_path):
  store.add(decision('a', 'b', 'same', decided_at='2026-01-01T10:00:00+00:00'))
  store.add(decision('c', 'd', 'same', decided_at='2026-01-01T10:00:00+00:00'))
  colleague = db_lib.Decisions(str(tmp_path / 'colleague.sqlite'))
  # Later than Ada's, in another time zone: it stands once imported; Ada dissents.
  colleague.add(decision('a', 'b', 'different', scholar='Ben',
                         decided_at='2026-01-01T12:00:00+01:00'))
  colleague.add(decision('c', 'd', 'same', scholar='Ben'))  # agrees
  colleague.add(decision('e', 'f', 'same', scholar='Ben'))  # new here
  result = exchange.merge(store, exchange.parse('ben.csv', exchange.to_csv(
      colleague.all(undone=True)).encode()), 'import: ben.csv')
  assert (result['added'], result['already'], result['undone']) == (3, 0, 0)
  assert result['changed'] == [dict(a='a', b='b', was='same', now='different', by='Ben'),
                               dict(a='e', b='f', was=None, now='same', by='Ben')]
  assert result['dissent'] == [dict(a='a', b='b', standing='different', by='Ben',
                                    dissent=[dict(verdict='same', scholar='Ada')])]
  standing = store.standing()
  assert standing[('a', 'b')].verdict == 'different'
  assert standing[('a', 'b')].decided_at == '2026-01-01T11:00:00.000000+00:00'
  assert standing[('e', 'f')].origin == 'import: ben.csv'
  # The dissent is kept: exported with its status, and so read back by the next import.
  rows = list(csv.DictReader(io.StringIO(exchange.to_csv(store.all(undone=True)))))
  assert [(r['a'], r['scholar'], r['status']) for r in rows if r['a'] == 'a'] == [
      ('a', 'Ada', 'dissent'), ('a', 'Ben', 'standing')]
  # Ada decides again: she agrees now, and her dissent is replaced.
  store.add(decision('a', 'b', 'different'))
  assert db_lib.dissent(store.all(undone=True)) == {}


def test_a_changed_mind_exports_as_replaced_and_imports_as_the_same_verdict(store, tmp_path):
  first = store.add(decision('a', 'b', 'unsure'))
  second = store.add(decision('a', 'b', 'same'))
  store.add(decision('b', 'c', 'same'))
  for fmt, text in [('csv', exchange.to_csv(store.all(undone=True))),
                    ('jsonld', exchange.to_jsonld(store.all(undone=True), 'test'))]:
    if fmt == 'csv':
      rows = list(csv.DictReader(io.StringIO(text)))
      assert [(r['uuid'], r['status'], r['replaced_by']) for r in rows[:2]] == [
          (first.uuid, 'replaced', second.uuid), (second.uuid, 'standing', '')]
    else:
      items = json.loads(text)['first']['items']
      assert items[0]['bg:replacedBy'] == f'urn:uuid:{second.uuid}'
      assert [i['bg:status'] for i in items] == ['replaced', 'standing', 'standing']
    other = db_lib.Decisions(str(tmp_path / f'other-{fmt}.sqlite'))
    result = exchange.merge(other, exchange.parse(f'ada.{fmt}', text.encode()), 'import')
    assert result['dissent'] == [] and result['added'] == 3
    assert {k: d.verdict for k, d in other.standing().items()} == {
        ('a', 'b'): 'same', ('b', 'c'): 'same'}
    assert db_lib.groups(other.standing()) == db_lib.groups(store.standing()) == [
        ['a', 'b', 'c']]


def test_an_undo_is_exported_and_made_again_by_the_import(store, tmp_path):
  colleague = db_lib.Decisions(str(tmp_path / 'colleague.sqlite'))
  kept = store.add(decision('a', 'b', 'same'))
  exchange.merge(colleague, exchange.parse('x.csv', exchange.to_csv(store.all(undone=True))
                                           .encode()), 'import')
  assert ('a', 'b') in colleague.standing()
  store.undo(kept.id, 'Ada')
  text = exchange.to_jsonld(store.all(undone=True), 'test')
  assert json.loads(text)['first']['items'][0]['bg:undone']['creator']['name'] == 'Ada'
  result = exchange.merge(colleague, exchange.parse('x.jsonld', text.encode()), 'import')
  assert (result['added'], result['undone']) == (0, 1)
  assert result['changed'] == [dict(a='a', b='b', was='same', now=None, by=None)]
  assert colleague.standing() == {}
  assert colleague.all(undone=True)[0].undone_by == 'Ada'


def test_two_scholars_exchanging_exports_converge_however_often_they_do(store, tmp_path):
  """A and B decide apart (agreeing, disagreeing, changing their minds, undoing), then
  import each other's export, A->B->A, again and again: both hold the same decisions, the
  same standing verdicts, the same dissent and the same groups."""
  a, b = store, db_lib.Decisions(str(tmp_path / 'b.sqlite'))
  t = lambda minute: f'2026-02-01T09:{minute:02d}:00+00:00'
  a.add(decision('p1', 'p2', 'unsure', decided_at=t(1)))
  a.add(decision('p1', 'p2', 'same', decided_at=t(2)))  # Ada changes her mind
  b.add(decision('p1', 'p2', 'different', scholar='Ben', decided_at=t(3)))  # later: stands
  b.add(decision('p2', 'p3', 'same', scholar='Ben', decided_at=t(1)))
  a.add(decision('p2', 'p3', 'different', decided_at=t(4)))
  undone = a.add(decision('p4', 'p5', 'same', decided_at=t(5)))
  a.undo(undone.id, 'Ada')
  b.add(decision('p4', 'p5', 'same', scholar='Ben', decided_at=t(6)))
  b.add(decision('p5', 'p6', 'same', scholar='Ben', decided_at=t(7)))
  a.add(decision('p6', 'p7', 'same', decided_at=t(8)))

  def send(source, target, name):
    return exchange.merge(target, exchange.parse(name, exchange.to_csv(
        source.all(undone=True)).encode()), f'import: {name}')

  def state(db):
    everything = db.all(undone=True)
    return ({k: (d.verdict, d.scholar) for k, d in db.standing().items()},
            db_lib.groups(db.standing()), sorted((d.uuid, d.undone_at is None)
                                                 for d in everything),
            {k: [(d.scholar, d.verdict) for d in v] for k, v in
             db_lib.dissent(everything).items()})

  send(a, b, 'a.csv')
  send(b, a, 'b.csv')
  assert state(a) == state(b)
  standing, groups, rows, dissent = state(a)
  assert len(rows) == 9
  assert standing[('p1', 'p2')] == ('different', 'Ben')
  assert standing[('p2', 'p3')] == ('different', 'Ada')
  assert standing[('p4', 'p5')] == ('same', 'Ben')
  assert groups == [['p4', 'p5', 'p6', 'p7']]
  assert dissent == {('p1', 'p2'): [('Ada', 'same')], ('p2', 'p3'): [('Ben', 'same')]}
  for _ in range(2):  # again: nothing moves
    assert send(a, b, 'a.csv')['added'] == send(b, a, 'b.csv')['added'] == 0
    assert state(a) == state(b) == (standing, groups, rows, dissent)


def test_a_database_of_the_older_schema_is_brought_up_to_date(tmp_path):
  path = str(tmp_path / 'old.sqlite')
  v1 = db_lib.SCHEMA.replace('  undone_by TEXT,\n', '')
  with sqlite3.connect(path) as raw:
    raw.executescript(f'{v1} PRAGMA user_version = 1;')
    raw.execute("INSERT INTO decisions (uuid, a, b, a_size, a_mtime_ns, b_size, b_mtime_ns, "
                "verdict, scholar, checkpoint, decided_at) VALUES ('u', 'a', 'b', 1, 2, 3, 4, "
                "'same', 'Ada', 'c', '2026-01-01T00:00:00.000000+00:00')")
  store = db_lib.Decisions(path)
  store.undo(1, 'Ada')
  assert store.all(undone=True)[0].undone_by == 'Ada'
  with sqlite3.connect(path) as raw:
    assert raw.execute('PRAGMA user_version').fetchone()[0] == db_lib.SCHEMA_VERSION


@pytest.mark.parametrize('text, message', [
    ('uuid,a,b\n1,x,y\n', 'bad.csv: CSV header lacks verdict'),
    (exchange.to_csv([decision('a', 'b')]).replace(',same,', ',maybe,').replace(
        'uuid,a', 'uuid,a').replace('\n,', '\nu1,'), "bad.csv: row 2: field verdict: 'maybe'"),
    (exchange.to_csv([decision('a', 'b', uuid='u1', decided_at=db_lib.now())]).replace(
        ',10,', ',ten,'),
     "bad.csv: row 2: field a_size: 'ten', expected an integer"),
    ('{"first": {"items": [{"id": "urn:uuid:1"}]}}', 'bad.csv: annotation 1: lacks'),
    ('{"not": "annotations"}', 'bad.csv: not a Web Annotation collection'),
    (b'\xff\xfe\x00', 'bad.csv: not UTF-8'),
])
def test_a_bad_import_is_refused_whole_in_one_line(store, text, message):
  data = text if isinstance(text, bytes) else text.encode()
  with pytest.raises(errors.UserError) as e:
    exchange.parse('bad.csv', data)
  assert str(e.value).startswith(message) and '\n' not in str(e.value)
  assert store.all() == []
