"""Every relative link in README.md, docs/*.md and the experiments' pages reaches a file of the
repository, and every `#anchor` into a markdown page names one of its headings (as GitHub
makes them); the README stays a short guide, and no project file names a tracker issue."""
import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINK = re.compile(r'\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')


def pages():
  return [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def experiment_pages():
  """The results page and the run logs, which link into the docs and the records."""
  return sorted(glob.glob(os.path.join(ROOT, 'experiments', '*.md')) +
                glob.glob(os.path.join(ROOT, 'experiments', 'logs', '*.md')))


def _prose(text, code_spans=False):
  """(number, line) of the lines outside fenced code blocks, inline code spans blanked
  unless `code_spans`."""
  fenced = False
  for number, line in enumerate(text.splitlines(), 1):
    if line.lstrip().startswith('```'):
      fenced = not fenced
      continue
    if not fenced:
      yield number, line if code_spans else re.sub(r'`[^`]*`', '``', line)


def anchors(path):
  """The heading anchors GitHub gives the page: lower case, punctuation dropped, spaces to
  hyphens, a repeated one numbered -1, -2, ..."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  seen, out = {}, set()
  for _, line in _prose(text, code_spans=True):
    m = re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
    if not m:
      continue
    slug = re.sub(r'[^\w\- ]', '', m.group(1).replace('`', '').lower()).replace(' ', '-')
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f'{slug}-{n}')
  return out


def broken_links(path):
  """'line N: target (why)' for each relative link of the page that leads nowhere."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  broken = []
  for number, line in _prose(text):
    for target in LINK.findall(line):
      if re.match(r'[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto: ...
        continue
      file_part, _, anchor = target.partition('#')
      where = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part \
          else path
      if not os.path.exists(where):
        broken.append(f'line {number}: {target} (no such file)')
      elif anchor and where.endswith('.md') and anchor not in anchors(where):
        broken.append(f'line {number}: {target} (no heading #{anchor} in '
                      f'{os.path.relpath(where, ROOT)})')
  return broken


@pytest.mark.parametrize('page', [os.path.relpath(p, ROOT)
                                  for p in pages() + experiment_pages()])
def test_every_relative_link_resolves(page):
  assert broken_links(os.path.join(ROOT, page)) == []


def test_the_readme_links_every_docs_page():
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    linked = set(LINK.findall(f.read()))
  for page in pages()[1:]:
    assert f'docs/{os.path.basename(page)}' in linked, page


def test_a_broken_link_is_found(tmp_path):
  (tmp_path / 'there.md').write_text('# A heading, `with code`\n\n## Twice\n\n## Twice\n')
  page = tmp_path / 'page.md'
  page.write_text('[ok](there.md) [ok](there.md#a-heading-with-code) [ok](there.md#twice-1)\n'
                  '[web](https://example.com/x.md) `[code](nowhere.md)`\n'
                  '```\n[fenced](nowhere.md)\n```\n'
                  '[gone](missing.md) [bad anchor](there.md#nope) [self](#twice)\n')
  assert broken_links(str(page)) == [
      'line 6: missing.md (no such file)',
      f'line 6: there.md#nope (no heading #nope in {os.path.relpath(tmp_path / "there.md", ROOT)})',
      f'line 6: #twice (no heading #twice in {os.path.relpath(page, ROOT)})',
  ]


def test_the_readme_is_a_guide_of_at_most_150_lines():
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    lines = f.read().splitlines()
  assert len(lines) <= 150, f'README.md has {len(lines)} lines: move detail to docs/ or ' \
      'experiments/results.md'


def test_no_project_file_names_a_tracker_issue():
  """The files say what is and what was measured; which issue asked for it belongs in the
  commit messages. The tests too: their docstrings are read as the behaviour's statement."""
  found = subprocess.run(
      ['git', 'grep', '-nIiE', r"\bissues? [0-9]+\b|\bthe issue('s)?\b", '--', '.'],
      cwd=ROOT, capture_output=True, text=True).stdout
  assert found == '', found


# The project's own top-level packages: a `python -m` of one of them must name a module that
# is there (pip, pytest and the like are someone else's).
PACKAGES = ('bengrapheme', 'retrieval', 'launch', 'bench', 'experiments', 'configs')
COMMAND = re.compile(r'python3? -m ((?:%s)(?:\.\w+)*)' % '|'.join(PACKAGES))


def missing_modules(text):
  """The modules `python -m X` names in `text` that are neither X.py nor X/__main__.py."""
  return sorted({m for m in COMMAND.findall(text)
                 if not any(part.isupper() for part in m.split('.'))  # python -m bench.NAME
                 and not os.path.isfile(os.path.join(ROOT, *m.split('.')) + '.py')
                 and not os.path.isfile(os.path.join(ROOT, *m.split('.'), '__main__.py'))})


def test_every_python_m_command_names_a_module_that_is_there():
  """What a message, a docstring or a page tells the user to run (errors quote these)."""
  tracked = subprocess.run(['git', 'ls-files', '*.py', '*.md', 'Makefile', '*.sh', '*.sbatch',
                            ':!tests/'], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
  missing = {}
  for path in tracked:
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
      if found := missing_modules(f.read()):
        missing[path] = found
  assert missing == {}


def test_a_command_of_a_moved_module_is_found():
  assert missing_modules('run `python -m retrieval.tfds_hisfrag20 --data_dir D` or '
                         'python -m launch.train, python -m experiments.NAME, python -m pip install x') == [
                             'retrieval.tfds_hisfrag20']
