"""The scholars' workbench: a local web app over a workdir's index.

  python -m launch.serve --workdir W [--db PATH] [--port 8765] [--round 20]

Serves, at http://127.0.0.1:8765/, the indexed collection paged as thumbnails, a search by
any of its images or by an uploaded one, and the candidate joins in rounds (the closest
pairs not yet decided, one at a time at one scale, or two on the joining table), each
decided same hand / different / unsure, by key or button, with a note and the scholar's
name. Decisions go to an SQLite database (default W/decisions.sqlite) with their history,
exported as CSV or W3C Web Annotation JSON-LD and merged with a colleague's
(retrieval/collections/workbench/). Shelfmarks and canvas IRIs come from the collection
folder's identifiers.csv (retrieval/collections/iiif.py writes one for a IIIF manifest). A
rebuilt index is served from the next request on, without a restart.

Only this machine can reach it unless --host names another address; then an access token is
required, printed here at start (open the address with ?token=...).
"""
import ipaddress
import os
import secrets
import socket

from absl import flags

from launch import cli

WORKDIR = flags.DEFINE_string('workdir', None, 'The workdir launch.index indexed with.')
INDEX = flags.DEFINE_string('index', None, 'The index folder (default: WORKDIR/index).')
DB = flags.DEFINE_string('db', None, 'The decisions database (default: WORKDIR/decisions.sqlite).')
HOST = flags.DEFINE_string('host', '127.0.0.1', 'The address to listen on; beyond loopback an '
                           'access token is required, printed at start.')
PORT = flags.DEFINE_integer('port', 8765, 'The port to listen on.', lower_bound=0)
ROUND = flags.DEFINE_integer('round', 20, 'Candidate pairs a round shows.', lower_bound=1)
CANDIDATES = flags.DEFINE_integer(
    'candidates', 1000, "The collection's closest pairs kept for its rounds (computed once, "
    'kept beside the index).', lower_bound=1)
MAX_UPLOAD_MB = flags.DEFINE_float('max_upload_mb', 20, 'The largest query image or import '
                                   'file taken, in MiB.', lower_bound=0.001)
flags.mark_flag_as_required('workdir')


def loopback(host):
  if host == 'localhost':
    return True
  try:
    return ipaddress.ip_address(host.strip('[]')).is_loopback
  except ValueError:
    return False


def main(argv):
  del argv
  from absl import logging
  logging.set_verbosity(logging.WARNING)
  import uvicorn
  from bengrapheme import console, errors
  from retrieval.collections.workbench import app as app_lib
  folder = INDEX.value or os.path.join(WORKDIR.value, 'index')
  local = loopback(HOST.value)
  settings = app_lib.Settings(
      workdir=WORKDIR.value, folder=folder,
      db=DB.value or os.path.join(WORKDIR.value, 'decisions.sqlite'), round_size=ROUND.value,
      candidates=CANDIDATES.value, max_upload_bytes=int(MAX_UPLOAD_MB.value * 2**20),
      token=None if local else secrets.token_urlsafe(24), loopback=local)
  # Bound here, before the index loads: a port in use is one line, not uvicorn's exit.
  family = socket.AF_INET6 if ':' in HOST.value else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((HOST.value.strip('[]'), PORT.value))
  except OSError as e:
    raise errors.UserError(f'--host {HOST.value} --port {PORT.value}: cannot listen there '
                           f'({e.strerror}); pick another --port')
  sock.listen(128)  # requests wait in the backlog until the server takes them
  app = app_lib.create(settings)
  app.state.workbench.candidates()  # the collection's closest pairs, before the first round
  port = sock.getsockname()[1]  # the one the system chose for --port 0
  host = f'[{HOST.value.strip("[]")}]' if ':' in HOST.value else HOST.value
  console.show(f'Workbench over {len(app.state.workbench.paths):,} images of '
               f'{app.state.workbench.root}; decisions in {settings.db}.\n'
               f'Open http://{host}:{port}/' +
               (f'?token={settings.token}' if settings.token else '') +
               '\n(Ctrl-C stops it; each decision is kept as it is made.)')
  uvicorn.Server(uvicorn.Config(app, log_level='warning', access_log=False)).run(
      sockets=[sock])


if __name__ == '__main__':
  cli.run(main)
