"""The decisions database and its exchange: one row a decision, undo, the schema version,
CSV and Web Annotation round trips, a colleague's import merged without overwriting, the
groups of 'same hand' pairs."""
import dataclasses
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
  with pytest.raises(errors.UserError, match='schema version 2'):
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
  text = (exchange.to_csv(store.all()) if fmt == 'csv' else
          exchange.to_jsonld(store.all(), 'test'))
  if fmt == 'jsonld':
    collection = json.loads(text)
    assert collection['type'] == 'AnnotationCollection'
    assert 'http://www.w3.org/ns/anno.jsonld' in collection['@context']
    first = collection['first']['items'][0]
    assert first['type'] == 'Annotation' and len(first['target']) == 2
  other = db_lib.Decisions(str(tmp_path / 'colleague.sqlite'))
  result = exchange.merge(other, exchange.parse(f'mine.{fmt}', text.encode()), 'import: x')
  assert result == dict(added=2, already=0, conflicts=[])
  strip = lambda d: dataclasses.replace(d, id=None, origin='')
  assert [strip(d) for d in other.all()] == [strip(d) for d in store.all()]
  # Importing the same file again adds nothing.
  again = exchange.merge(other, exchange.parse(f'mine.{fmt}', text.encode()), 'import: x')
  assert again == dict(added=0, already=2, conflicts=[])


def test_an_import_lists_conflicts_and_overwrites_nothing(store, tmp_path):
  colleague = db_lib.Decisions(str(tmp_path / 'colleague.sqlite'))
  colleague.add(decision('a', 'b', 'different', scholar='Ben'))  # disagrees
  colleague.add(decision('c', 'd', 'same', scholar='Ben'))  # agrees
  colleague.add(decision('e', 'f', 'same', scholar='Ben'))  # new here
  store.add(decision('a', 'b', 'same'))
  store.add(decision('c', 'd', 'same'))
  result = exchange.merge(store, exchange.parse('ben.csv', exchange.to_csv(colleague.all())
                                                .encode()), 'import: ben.csv')
  assert result['added'] == 2 and result['already'] == 0
  assert result['conflicts'] == [dict(a='a', b='b', here='same', here_by='Ada',
                                      theirs='different', theirs_by='Ben')]
  standing = store.standing()
  assert standing[('a', 'b')].verdict == 'same' and standing[('a', 'b')].scholar == 'Ada'
  assert standing[('e', 'f')].origin == 'import: ben.csv'


@pytest.mark.parametrize('text, message', [
    ('uuid,a,b\n1,x,y\n', 'bad.csv: CSV header lacks verdict'),
    (exchange.to_csv([decision('a', 'b')]).replace(',same,', ',maybe,').replace(
        'uuid,a', 'uuid,a').replace('\n,', '\nu1,'), "bad.csv: row 2: field verdict: 'maybe'"),
    (exchange.to_csv([decision('a', 'b', uuid='u1')]).replace(',10,', ',ten,'),
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
