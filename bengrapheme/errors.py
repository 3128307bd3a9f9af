"""Failures a user fixes from the message alone, and interruptions: what the command-line
entry points (launch/cli.py) print as one line instead of a traceback, which would only bury
the message among frames of the framework's code."""
import contextlib
import gc
import os
import signal
import sys
import threading


class UserError(Exception):
  """Input or a setting the user can fix: a missing or malformed data folder, a workdir with
  no checkpoint or held by another run, a full disk, a loss gone NaN. The message names the
  file, folder or setting, what was expected and what to do."""


class NotEmpty(UserError, FileExistsError, ValueError):
  """An output folder already holds files, which a run would mix its own into."""


class ConfigError(UserError, ValueError):
  """A config value outside what its field allows: the message names the field's full path
  (as --config.PATH=... sets it) and the allowed values. A task's validate(config) raises it
  before any data work."""


def field(config, path):
  """config's value at the dotted `path` ('eval.whitening')."""
  value = config
  for key in path.split('.'):
    value = value[key]
  return value


def require(config, path, allowed):
  """ConfigError unless the field at `path` holds one of `allowed`."""
  value = field(config, path)
  if value not in allowed:
    raise ConfigError(f'{path}={value!r}: expected one of {", ".join(map(repr, allowed))}')


class Interrupted(KeyboardInterrupt):
  """Ctrl-C, with the one line to print: what was interrupted and what was kept."""


@contextlib.contextmanager
def on_ctrl_c(message):
  """Ctrl-C inside the block raises Interrupted(message) (what was interrupted, what was
  kept; a callable is asked then); an Interrupted from deeper inside, which says more,
  passes unchanged."""
  try:
    yield
  except KeyboardInterrupt as e:
    if isinstance(e, Interrupted):
      raise
    raise Interrupted(message() if callable(message) else message) from None


def traceback_asked():
  """BENGRAPHEME_TRACEBACK=1: show the full traceback of such errors too."""
  return os.environ.get('BENGRAPHEME_TRACEBACK', '') not in ('', '0')


def _ctrl_c(signum, frame):
  """Python's own Ctrl-C, except inside a garbage collector's callback (jax registers one,
  and collections are frequent): a KeyboardInterrupt raised there is printed as "Exception
  ignored" with a traceback and dropped, and the program runs on. Sent again a moment later,
  the signal lands outside."""
  callbacks = {getattr(callback, '__code__', None) for callback in gc.callbacks}
  while frame is not None:
    if frame.f_code in callbacks:
      threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)).start()
      return
    frame = frame.f_back
  raise KeyboardInterrupt


def run_reporting(fn, *args, traceback=False):
  """fn(*args), ending the program with one line on stderr instead of a traceback on a
  UserError (status 1) or Ctrl-C (status 130), unless `traceback` or traceback_asked()."""
  takes_ctrl_c = (threading.current_thread() is threading.main_thread()
                  and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
  if takes_ctrl_c:  # not where Ctrl-C is ignored (a job started in the background)
    signal.signal(signal.SIGINT, _ctrl_c)
  try:
    return fn(*args)
  except UserError as e:
    if traceback or traceback_asked():
      raise
    print(f'Error: {e}', file=sys.stderr, flush=True)
    sys.exit(1)
  except KeyboardInterrupt as e:
    if traceback or traceback_asked():
      raise
    print(str(e) if isinstance(e, Interrupted) else 'Interrupted (Ctrl-C).', file=sys.stderr,
          flush=True)
    sys.exit(130)
  finally:
    if takes_ctrl_c:
      signal.signal(signal.SIGINT, signal.default_int_handler)
