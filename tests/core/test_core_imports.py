"""The core (bengrapheme/*.py, bengrapheme/models/) names no task: a task plugs in through
config.task, so adding one never needs an edit here."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = sorted([*ROOT.glob('bengrapheme/*.py'), *ROOT.glob('bengrapheme/models/*.py')])
TASK_PACKAGES = ('bengrapheme.grapheme', 'retrieval')


def names_a_task(text):
  return any(text == p or text.startswith(p + '.') for p in TASK_PACKAGES)


def task_references(path):
  """Imports of a task package, and string constants that spell one (importlib, __import__)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names if names_a_task(a.name)]
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ''
      if node.level == 0 and names_a_task(module):
        found.append(module)
      elif node.level == 0 and module == 'bengrapheme':
        found += [f'bengrapheme.{a.name}' for a in node.names if a.name == 'grapheme']
      elif node.level > 0 and ('grapheme' in module.split('.') or
                               any(a.name == 'grapheme' for a in node.names)):
        found.append('.' * node.level + module)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      if names_a_task(node.value) or node.value in ('.report', 'grapheme'):
        found.append(repr(node.value))
    elif isinstance(node, ast.JoinedStr | ast.BinOp):  # a module name built from parts
      parts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]
      if any(isinstance(p, str) and p.strip('.') in ('report', 'task', 'grapheme') for p in parts):
        found.append(ast.unparse(node))
  return found


def test_the_check_sees_each_kind_of_reference(tmp_path):
  bad = tmp_path / 'bad.py'
  for line in ('from bengrapheme.grapheme import kaggle', 'import retrieval.fragments.metrics',
               'from bengrapheme import grapheme', 'from .grapheme import task',
               "importlib.import_module('retrieval.fragments.report')",
               "importlib.import_module(config.task.rpartition('.')[0] + '.report')"):
    bad.write_text(line + '\n')
    assert task_references(bad), line
  bad.write_text('from bengrapheme import files\nimport importlib\n'
                 'importlib.import_module(config.task)\n')
  assert not task_references(bad)


@pytest.mark.parametrize('path', CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_file_names_no_task(path):
  assert not task_references(path), f'{path.relative_to(ROOT)} reaches into a task'
