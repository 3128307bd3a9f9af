"""Every figure the README reports comes from a kept record: its accuracy tables equal the
records in bench/records/, and every benchmark row says where, when and at which commit it
was measured."""
import json
import os
import re

import pytest

from bench import records, run


@pytest.fixture(scope='module')
def readme():
  with open(run.README) as f:
    return f.read()


@pytest.mark.parametrize('name', sorted(records.TABLES))
def test_readme_table_is_what_its_records_say(readme, name):
  assert records.readme_block(readme, name) == records.table(name), (
      f'README table {name!r} differs from its records: `python -m bench.records readme`')


def test_every_record_says_how_it_was_made():
  names = {record for _, rows in records.TABLES.values() for _, record, _ in rows}
  assert names == {f[:-5] for f in os.listdir(records.RECORDS) if f.endswith('.json')}
  for name in names:
    record = records.load(name)
    assert record['name'] == name
    assert re.fullmatch(r'[0-9a-f]{40}', record['commit']), record['commit']
    assert record['commands'] and all(c.startswith('python -m ') for c in record['commands'])
    assert record['date'][:4] == '2026' and record['machine']['cpu_count'] >= 1
    assert record['scores'] and all(isinstance(v, (int, float, str))
                                    for v in record['scores'].values())


def test_a_table_cell_without_a_score_is_an_error(monkeypatch):
  columns, rows = records.TABLES['fragments-demo']
  monkeypatch.setitem(records.TABLES, 'fragments-demo',
                      (columns, [('typo', rows[0][1], 'test/no_such_method/')]))
  with pytest.raises(KeyError, match='test/no_such_method/writer/map'):
    records.table('fragments-demo')


def test_every_benchmark_row_names_its_machine_date_and_commit():
  with open(run.RESULTS) as f:
    results = json.load(f)
  for row in results['results']:
    assert re.fullmatch(r'[0-9a-f]{40}(-dirty)?', row['commit']), row['name']
    assert row['date'][:4] == '2026', row['name']
    assert {'cpu', 'cpu_count', 'jax', 'jax_backend'} <= set(row['machine']), row['name']
