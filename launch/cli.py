"""How every entry point starts: `--help` lists the project's own flags, one line each, and
exits 0 (absl's own --help lists none of them among ~90 absl flags and exits 1); anything
else goes to absl's app.run."""
import os
import sys

from absl import app, flags

HELP = ('-h', '-?', '--help', '--helpshort')


def own_flags():
  """The flags the project defines (launch/*.py, also when run as __main__)."""
  here = os.path.dirname(os.path.abspath(__file__))
  own = []
  for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
    path = os.path.abspath(module) if module.endswith('.py') else ''
    if module.startswith('launch.') or module == '__main__' or path.startswith(here):
      own += [f for f in module_flags if f not in own]
  return own


def usage(doc):
  lines = [(doc or '').strip(), '', 'Flags:']
  for f in own_flags():
    default = '' if f.default in (None, '', False) else f' (default: {f.default})'
    lines.append(f'  --{f.name}: {" ".join(f.help.split())}{default}')
  lines.append('  --helpfull: every flag, absl\'s and jax\'s included')
  return '\n'.join(lines)


def run(main):
  if any(arg in HELP for arg in sys.argv[1:]):
    print(usage(sys.modules['__main__'].__doc__))
    sys.exit(0)
  app.run(main)
