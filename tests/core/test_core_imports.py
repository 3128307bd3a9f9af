"""The core (bengrapheme/*.py, bengrapheme/models/) names no task: a task plugs in through
config.task, so adding one never needs an edit here."""
import ast
import pathlib
import re

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


# What only a task knows: the words the core's code would need to name one (its modules,
# configs, evaluators, data formats and recipes).
TASK_WORDS = ('maskfeat', 'saghog', 'collection', 'knn_probe', 'knn', 'writer_id',
              'fragments', 'grapheme', 'netrvlad', 'hisfrag20', 'configs')


def task_words(path):
  """The task words that the code of `path` spells: in a string (docstrings and comments
  aside, which may cite a task as an example) or an identifier."""
  # Whole words, '_' a separator too ('knn_probe_features' names the probe).
  pattern = re.compile(r'(?<![a-z0-9])(' + '|'.join(TASK_WORDS) + r')(?![a-z0-9])', re.IGNORECASE)
  tree = ast.parse(path.read_text(), str(path))
  docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                and node.body and isinstance(node.body[0], ast.Expr)}
  found = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings):
      found += pattern.findall(node.value)
    elif isinstance(node, ast.Name | ast.Attribute | ast.arg | ast.FunctionDef | ast.ClassDef):
      found += pattern.findall(getattr(node, 'id', None) or getattr(node, 'attr', None)
                               or getattr(node, 'arg', None) or node.name)
  return found


def test_the_word_check_sees_a_task_in_code_only(tmp_path):
  bad = tmp_path / 'bad.py'
  for line in ("if config.data.format == 'collection': pass",
               "advice = f'python -m launch.train --config configs/maskfeat.py:demo'",
               'def knn_probe_features(model): pass', 'x = task.saghog'):
    bad.write_text(line + '\n')
    assert task_words(bad), line
  bad.write_text('"""A docstring may cite MaskFeat."""\nimport collections  # a fragments run\n')
  assert not task_words(bad)


@pytest.mark.parametrize('path', CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_code_names_no_task(path):
  assert not task_words(path), f'{path.relative_to(ROOT)} names a task: {task_words(path)}'
