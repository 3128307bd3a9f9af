"""Every figure the README, docs/ and experiments/results.md report comes from a kept record:
their accuracy tables equal the records in experiments/records/, each record's commit holds
the code its commands ran, and every benchmark row says where, when and at which commit it
was measured."""
import json
import os
import re
import subprocess

import pytest

from bench import common, run
from experiments import records


def _table_pages():
  """(table, page) for every page that holds the table's markers; a table that no page
  holds is left to test_every_table_stands_in_a_page."""
  pairs = []
  for name in sorted(records.TABLES):
    try:
      holders = records.pages_holding(name)
    except ValueError:
      continue
    pairs += [(name, os.path.relpath(page, common.ROOT)) for page in holders]
  return pairs


def test_every_table_stands_in_a_page():
  for name in records.TABLES:
    assert records.pages_holding(name), name  # raises, naming the table, when none does


@pytest.mark.parametrize('name,page', _table_pages())
def test_table_is_what_its_records_say(name, page):
  path = os.path.join(common.ROOT, page)
  with open(path) as f:
    text = f.read()
  assert records.block(text, name, path) == records.table(name, path), (
      f'{page}: table {name!r} differs from its records: `python -m experiments.records readme`')


def test_the_results_page_holds_every_table():
  """experiments/results.md is where every run behind a choice can be found; the README and
  the guides show a few of the same tables beside their text."""
  results = os.path.join(common.ROOT, 'experiments', 'results.md')
  missing = [name for name in records.TABLES if results not in records.pages_holding(name)]
  assert not missing, f'experiments/results.md lacks the tables {missing}'


def test_record_links_are_relative_to_their_page():
  docs_page = os.path.join(common.ROOT, 'docs', 'x.md')
  assert '](experiments/records/grapheme-demo.json)' in records.table('grapheme-demo')
  assert '](../experiments/records/grapheme-demo.json)' in records.table('grapheme-demo', docs_page)


def test_a_table_no_page_holds_is_an_error_naming_it(tmp_path):
  page = tmp_path / 'page.md'
  page.write_text('# no tables here\n')
  with pytest.raises(ValueError, match="table 'fragments-demo': no page holds"):
    records.pages_holding('fragments-demo', [str(page)])
  with pytest.raises(ValueError, match="table '.*': no page holds"):
    records.write_pages([str(page)])
  assert page.read_text() == '# no tables here\n'


def test_write_pages_redraws_every_copy_and_nothing_else(tmp_path):
  begin, end = records.markers('grapheme-demo')
  others = [name for name in records.TABLES if name != 'grapheme-demo']
  docs = tmp_path / 'docs'
  docs.mkdir()
  readme, page = tmp_path / 'README.md', docs / 'page.md'
  readme.write_text(f'# r\n{begin}\nstale\n{end}\nafter\n' + ''.join(
      '\n'.join(records.markers(name)) + '\n' for name in others))
  page.write_text(f'# p\n\n{begin}\n{end}\n')
  records.write_pages([str(readme), str(page)])
  assert readme.read_text() == (
      f'# r\n{begin}\n{records.table("grapheme-demo", str(readme))}\n{end}\nafter\n' +
      ''.join(f'{records.markers(name)[0]}\n{records.table(name, str(readme))}\n'
              f'{records.markers(name)[1]}\n' for name in others))
  assert page.read_text() == f'# p\n\n{begin}\n{records.table("grapheme-demo", str(page))}\n{end}\n'


def test_every_record_says_how_it_was_made():
  names = {record for table in records.TABLES for record in records.record_names(table)}
  assert names == {f[:-5] for f in os.listdir(records.RECORDS) if f.endswith('.json')}
  for name in names:
    record = records.load(name)
    assert record['name'] == name
    assert re.fullmatch(r'[0-9a-f]{40}', record['commit']), record['commit']
    assert len(record.get('commits', record['commands'])) == len(record['commands']), name
    assert record['commands'] and all(c.startswith('python -m ') for c in record['commands'])
    assert record['date'][:4] == '2026' and record['machine']['cpu_count'] >= 1
    assert record['scores'] and all(isinstance(v, (int, float, str))
                                    for v in record['scores'].values())


def _git(*args, cwd=common.ROOT):
  return subprocess.run(['git', *args], cwd=cwd, capture_output=True, text=True)


def test_every_record_command_names_a_module_its_commit_holds():
  """A record's commit holds the code that made it: each `python -m MODULE` it names is a
  file in that commit's tree (modules moved since existed there under their old names)."""
  if _git('rev-parse', '--is-shallow-repository').stdout.strip() == 'true':
    pytest.fail("a shallow clone lacks the records' commits: `git fetch --unshallow` first")
  missing = []
  for path in sorted(os.listdir(records.RECORDS)):
    record = records.load(path[:-len('.json')])
    commits = record.get('commits', [record['commit']] * len(record['commands']))
    for command, commit in zip(record['commands'], commits):
      module = command.split()[2].replace('.', '/')
      if not any(_git('cat-file', '-e', f'{commit}:{module}{end}').returncode == 0
                 for end in ('.py', '/__main__.py')):
        missing.append(f'{record["name"]}: {module} at {commit[:7]}')
  assert not missing, missing


@pytest.fixture
def checkout(tmp_path, monkeypatch):
  """A git repository with one commit, standing in for the project's checkout."""
  for args in (('init', '-q'), ('config', 'user.email', 'a@b'), ('config', 'user.name', 'a')):
    _git(*args, cwd=tmp_path)
  (tmp_path / 'code.py').write_text('x = 1\n')
  _git('add', 'code.py', cwd=tmp_path)
  _git('commit', '-q', '-m', 'code', cwd=tmp_path)
  monkeypatch.setattr(common, 'ROOT', str(tmp_path))
  return tmp_path


def test_a_record_is_refused_while_code_is_uncommitted(checkout, monkeypatch, tmp_path):
  head = _git('rev-parse', 'HEAD', cwd=checkout).stdout.strip()
  (checkout / 'README.md').write_text('pages hold no code\n')
  assert records.commit_of() == head
  (checkout / 'code.py').write_text('x = 2\n')
  with pytest.raises(SystemExit, match=r'changes git has not committed \(code.py\): commit '):
    records.commit_of()
  (checkout / 'code.py').write_text('x = 1\n')
  (checkout / 'study.py').write_text('')  # untracked code ran too
  with pytest.raises(SystemExit, match=r'\(study.py\)'):
    records.commit_of()
  assert records.commit_of(head[:7]) == head  # where the commands ran is given: no check
  with pytest.raises(SystemExit, match="commit 'f00': no such commit"):
    records.commit_of('f00')
  monkeypatch.setattr(records, 'RECORDS', str(tmp_path / 'records'))
  with pytest.raises(SystemExit, match='not committed'):
    records.add('dirty', None, ['python -m study'], '', '', scores={'a': 1})
  assert not (tmp_path / 'records').exists()


def test_a_record_of_commands_at_several_commits_names_each(checkout, monkeypatch, tmp_path):
  first = _git('rev-parse', 'HEAD', cwd=checkout).stdout.strip()
  (checkout / 'code.py').write_text('x = 2\n')
  _git('commit', '-q', '-am', 'more', cwd=checkout)
  second = _git('rev-parse', 'HEAD', cwd=checkout).stdout.strip()
  monkeypatch.setattr(records, 'RECORDS', str(tmp_path / 'records'))
  monkeypatch.setattr(records.run, 'machine', lambda: {'cpu_count': 2})
  path = records.add('two', None, ['python -m a', 'python -m b'], '', '', scores={'s': 1.0},
                     commits=[first[:7], second])
  with open(path) as f:
    record = json.load(f)
  assert record['commits'] == [first, second] and record['commit'] == second
  with pytest.raises(SystemExit, match='1 commits for 2 commands'):
    records.add('two', None, ['python -m a', 'python -m b'], '', '', scores={}, commits=[first])


def test_an_unfinished_sweep_is_not_kept(tmp_path, monkeypatch):
  monkeypatch.setattr(records, 'RECORDS', str(tmp_path / 'records'))
  with pytest.raises(SystemExit, match='no sweep record there; give --workdir'):
    records.add_sweep('sweep-x', str(tmp_path), '')
  (tmp_path / 'sweep').mkdir()
  (tmp_path / 'sweep' / 'record.json').write_text(json.dumps(dict(
      chosen=dict(trial=0), trials=[dict(trial=0, state='complete'),
                                    dict(trial=1, state='running')])))
  with pytest.raises(SystemExit, match=r'has not finished \(trials running: \[1\]'):
    records.add_sweep('sweep-x', str(tmp_path), '')
  assert not os.path.exists(records.RECORDS)


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


def test_the_benchmark_tables_hold_what_results_json_says():
  """docs/benchmarks.md's table and the README's few rows are redrawn from results.json."""
  with open(run.RESULTS) as f:
    results = json.load(f)
  for path, text, (begin, end) in ((run.PAGE, run.table(results), (run.BEGIN, run.END)),
                                   (run.README, run.summary(results),
                                    (run.SUMMARY_BEGIN, run.SUMMARY_END))):
    with open(path) as f:
      page = f.read()
    assert page[page.index(begin) + len(begin):page.index(end)] == f'\n{text}\n', path
