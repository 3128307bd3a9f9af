"""No import cycle anywhere in the project: every import between its modules, at module level
or inside a function, points one way. A cycle means two files that cannot be read, tested or
moved apart; retrieval/'s packages by role (fragments, features, collections, synthetic) and
the core stay layered only while this holds."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ('bengrapheme', 'retrieval', 'launch', 'configs', 'bench', 'experiments')


def module_name(path):
  parts = list(path.relative_to(ROOT).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def project_modules():
  return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob('*.py')}


def imports_of(path, modules):
  """The project modules `path` imports (`from a.b import c` counts a.b.c when c is a module)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names = [f'{node.module}.{a.name}' if f'{node.module}.{a.name}' in modules else node.module
               for a in node.names]
    else:
      continue
    found.update(n for n in names if n in modules)
  return found


def cycles(graph):
  """Each strongly connected component of more than one module (Tarjan), sorted."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1 or v in graph.get(v, ()):
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return sorted(out)


def test_the_check_finds_a_cycle():
  assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
  assert cycles({'a': {'b'}, 'b': set()}) == []


def test_no_import_cycle():
  modules = project_modules()
  graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
  # A package's __init__ re-exporting its own modules is not a cycle of files.
  graph = {v: {w for w in ws if not v.startswith(w + '.')} for v, ws in graph.items()}
  found = cycles(graph)
  assert not found, 'import cycles: ' + '; '.join(' <-> '.join(c) for c in found)
