"""How every entry point starts and ends.

`--help` lists the project's own flags, one line each, and exits 0 (absl's own --help lists
none of them among ~90 absl flags and exits 1); anything else goes to absl's app.run. An
error the user can fix (bengrapheme/errors.py) ends the run with its one-line message on
stderr, status 1; Ctrl-C with one line saying what was interrupted and what was kept, status
130; a bad flag with `Error: flag --NAME=VALUE: why`, status 1. --traceback (or
BENGRAPHEME_TRACEBACK=1) shows the full traceback instead. Compiled programs are cached on
disk (--compile_cache; bengrapheme/compile_cache.py).
"""
import os
import sys

from absl import app, flags

from bengrapheme import compile_cache, errors

HELP = ('-h', '-?', '--help', '--helpshort')

TRACEBACK = flags.DEFINE_bool(
    'traceback', False, 'On an error a user can fix, or Ctrl-C, print the full traceback '
    'rather than one line (also: BENGRAPHEME_TRACEBACK=1).')

COMPILE_CACHE = flags.DEFINE_string(
    'compile_cache', '~/.cache/bengrapheme/xla', 'Folder of XLA\'s persistent compilation '
    'cache, so that a restart or another command on the same config reads its compiled '
    'programs back rather than compiling them again (\'\': off).')


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
  # This module's flags last: first what the entry point itself is about.
  last = {COMPILE_CACHE.name: 1, TRACEBACK.name: 2}
  for f in sorted(own_flags(), key=lambda f: last.get(f.name, 0)):
    default = '' if f.default in (None, '', False, []) else f' (default: {f.default})'
    lines.append(f'  --{f.name}: {" ".join(f.help.split())}{default}')
  lines.append('  --helpfull: every flag, absl\'s and jax\'s included')
  return '\n'.join(lines)


def one_line_errors(main):
  """main, with the compilation cache on (--compile_cache), ending with one line (not a
  traceback) on a user's error or Ctrl-C."""
  def cached(argv):
    compile_cache.enable(COMPILE_CACHE.value)
    return main(argv)
  return lambda argv: errors.run_reporting(cached, argv, traceback=TRACEBACK.value)


def parse_flags(argv):
  """absl's parsing, with a bad flag said in one line like every other error (absl adds a
  'FATAL' prefix and a second line pointing at --helpfull)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'Error: {e}', file=sys.stderr, flush=True)
    sys.exit(1)


def run(main):
  if any(arg in HELP for arg in sys.argv[1:]):
    try:
      print(usage(sys.modules['__main__'].__doc__), flush=True)
    except BrokenPipeError:  # `--help | head`: the reader has what it wanted
      # Python's advice: point stdout elsewhere, or its flush at exit fails a second time.
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
  app.run(one_line_errors(main), flags_parser=parse_flags)
