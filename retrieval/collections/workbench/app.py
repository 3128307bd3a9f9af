"""The workbench's web app (FastAPI): one page (static/) and the JSON it reads.

  GET  /                          the page
  GET  /api/info                  the index, the database, the round size
  GET  /api/items?page=&per=&q=   the collection, paged (q: a part of the path)
  GET  /image?path=&size=         an indexed image as PNG (size: longest side; 0 full)
  GET  /api/search?path=&top=     an indexed image's nearest
  POST /api/search/upload?name=   an image's nearest (the body: the image file)
  GET  /api/round?size=&path=     the next round of candidate joins (path: one image's)
  POST /api/decisions             {a, b, verdict, note, scholar, distance, rank}
  POST /api/decisions/ID/undo
  GET  /api/decisions             the standing decisions, newest first
  GET  /api/export.csv, /api/export.jsonld
  POST /api/import?name=          a colleague's export (the body: the file)
  GET  /api/groups                fragments joined by 'same hand', transitively

Guards (retrieval/collections/workbench/images.py for the files): with an access token (required by
launch.serve beyond loopback) every request carries it (?token= once, then a cookie); on
loopback the Host header must be a loopback name, so that a web page elsewhere cannot reach
the app by rebinding its own name to 127.0.0.1; a POST must carry the X-Workbench header,
which a page of another origin cannot set without the app's consent, so a visited site
cannot decide in the scholar's name.
"""
import dataclasses
import hmac
import os
import tempfile
import threading

import fastapi
from fastapi import responses
from starlette.concurrency import run_in_threadpool

from bengrapheme import errors
from retrieval.collections import index as index_lib, search
from retrieval.collections import decisions as db_lib
from retrieval.collections.workbench import exchange, images, rounds

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'static')
LOOPBACK_NAMES = ('127.0.0.1', 'localhost', '[::1]', '::1')
COOKIE = 'bengrapheme_workbench'


@dataclasses.dataclass
class Settings:
  workdir: str
  folder: str  # the index folder
  db: str
  round_size: int = 20
  candidates: int = 1000  # closest pairs kept for the collection's rounds
  max_upload_bytes: int = 20 * 2**20
  token: str | None = None
  loopback: bool = True


class Workbench:
  """What the app serves: the index, its search, the database."""

  def __init__(self, settings):
    self.settings = settings
    self.index = index_lib.load(os.path.join(settings.folder, 'index.npz'))
    self.root = self.index.header['root']
    self.paths = self.index.entries.paths.tolist()
    self.row_of = {p: r for r, p in enumerate(self.paths)}
    self.searcher = search.Searcher.of(self.index)
    self.decisions = db_lib.Decisions(settings.db)
    self._candidates, self._ranking = None, threading.Lock()
    self.embedding = threading.Lock()  # one upload embedded at a time: the model is large
    self._model = None  # (config, model) of the index's checkpoint, restored at the first upload

  def candidates(self):
    """The collection's closest pairs, ranked at the first call (launch.serve makes it
    before it opens) and kept beside the index."""
    with self._ranking:
      if self._candidates is None:
        self._candidates = rounds.candidate_pairs(self.settings.folder, self.searcher,
                                                  self.settings.candidates)
      return self._candidates

  def row(self, path):
    if path not in self.row_of:
      raise images.Refused(404, f'{path!r}: not an image of the index')
    return self.row_of[path]

  def decided(self):
    return set(self.decisions.standing())

  def check_unchanged(self, path):
    """(size, mtime) as indexed; Refused when the file changed (or went) since."""
    r = self.row(path)
    real = images.resolve(self.root, path, self.row_of)
    indexed = int(self.index.entries.sizes[r]), int(self.index.entries.mtimes[r])
    try:
      stat = os.stat(real)
      now = stat.st_size, stat.st_mtime_ns
    except FileNotFoundError:
      now = None
    if now != indexed:
      raise images.Refused(409, f'{path} changed since it was indexed ('
                           f'{"removed" if now is None else "size or time differ"}): not '
                           'decided; rerun python -m launch.index, then decide on what it '
                           'shows now')
    return indexed

  def matches(self, rows, dist):
    return [dict(path=self.paths[j], distance=round(float(d), 4), rank=k)
            for k, (j, d) in enumerate(zip(rows.tolist(), dist.tolist()), 1)]

  def search_upload(self, name, data, top):
    """The nearest of an uploaded image, embedded with the index's checkpoint and settings
    (retrieval/collections/search.py's path for a query outside the collection). The file lives in a
    temporary folder for the embedding only."""
    images.check_upload(name, data)
    safe = ''.join(c if c.isalnum() or c in '._-' else '_' for c in os.path.basename(name))
    with self.embedding, tempfile.TemporaryDirectory(prefix='workbench-query-') as tmp:
      path = os.path.join(tmp, safe or 'query')
      with open(path, 'wb') as f:
        f.write(data)
      if self._model is None:
        self._model = search.query_model(self.settings.workdir, self.index)
      q, q_lbp = search.query_vectors(*self._model, self.index, self.searcher, [path])
    rows, dist = self.searcher.nearest(q, q_lbp, top)
    return self.matches(rows[0], dist[0])


def _json_decision(d):
  return dataclasses.asdict(d)


def create(settings):
  """The FastAPI app over settings.folder's index and settings.db."""
  bench = Workbench(settings)
  app = fastapi.FastAPI(title='bengrapheme workbench', docs_url=None, redoc_url=None,
                        openapi_url=None)
  app.state.workbench = bench

  @app.exception_handler(errors.UserError)
  async def user_error(request, e):
    return responses.JSONResponse({'error': str(e)}, getattr(e, 'status', 400))

  @app.middleware('http')
  async def guard(request, call_next):
    host = request.headers.get('host', '').rsplit(':', 1)[0]
    if settings.loopback and host not in LOOPBACK_NAMES:
      return responses.PlainTextResponse(f'Host {host!r} refused: the workbench answers on '
                                         'loopback names only', 403)
    given = request.query_params.get('token') or request.cookies.get(COOKIE, '')
    if settings.token and not hmac.compare_digest(given.encode(), settings.token.encode()):
      return responses.PlainTextResponse('An access token is required: open the address '
                                         'launch.serve printed at start (…/?token=…)', 403)
    if request.method == 'POST' and request.headers.get('x-workbench') != '1':
      return responses.PlainTextResponse('POST without the X-Workbench header refused', 403)
    response = await call_next(request)
    if settings.token and request.query_params.get('token'):
      response.set_cookie(COOKIE, settings.token, httponly=True, samesite='strict')
    return response

  @app.get('/')
  def page():
    return responses.FileResponse(os.path.join(STATIC, 'index.html'))

  @app.get('/static/{name}')
  def static(name: str):
    if name not in ('app.js', 'app.css'):
      raise images.Refused(404, f'{name}: no such file')
    return responses.FileResponse(os.path.join(STATIC, name))

  @app.get('/api/info')
  def info():
    h = bench.index.header
    return dict(images=len(bench.paths), root=h['root'], step=h['step'],
                checkpoint=h.get('checkpoint'), settings=h['settings'], db=settings.db,
                round_size=settings.round_size, candidates=len(bench._candidates or ()),
                decisions=len(bench.decisions.standing()))

  @app.get('/api/items')
  def items(page: int = 1, per: int = 48, q: str = ''):
    per = max(1, min(per, 500))
    chosen = [p for p in bench.paths if q.lower() in p.lower()] if q else bench.paths
    start = (max(page, 1) - 1) * per
    return dict(total=len(chosen), page=page, per=per, paths=chosen[start:start + per])

  @app.get('/image')
  def image(path: str, size: int = 0):
    real = images.resolve(bench.root, path, bench.row_of)
    stat = os.stat(real)
    data = images.png(real, max(0, min(size, 4096)), (stat.st_size, stat.st_mtime_ns))
    return responses.Response(data, media_type='image/png',
                              headers={'Cache-Control': 'private, max-age=3600'})

  @app.get('/api/search')
  def search_item(path: str, top: int = 20):
    r = bench.row(path)
    s = bench.searcher
    rows, dist = s.nearest(s.descriptors[[r]], s.lbp[[r]], max(1, min(top, 500)), exclude=[r])
    return dict(query=path, matches=bench.matches(rows[0], dist[0]))

  @app.post('/api/search/upload')
  async def search_upload(request: fastapi.Request, name: str = 'query', top: int = 20):
    data = await images.read_limited(request.stream(), settings.max_upload_bytes, name)
    found = await run_in_threadpool(bench.search_upload, name, data, max(1, min(top, 500)))
    return dict(query=name, matches=found)

  @app.get('/api/round')
  def next_round(size: int = 0, path: str = ''):
    size = max(1, min(size or settings.round_size, 200))
    decided = bench.decided()
    if path:
      pairs = rounds.image_round(bench.searcher, bench.paths, bench.row(path), decided, size)
    else:
      pairs = rounds.collection_round(bench.candidates(), bench.paths, decided, size)
    return dict(pairs=pairs, anchor=path or None, decided=len(decided))

  @app.post('/api/decisions')
  def decide(body: dict = fastapi.Body(...)):
    try:
      a, b = str(body['a']), str(body['b'])
      verdict, scholar = str(body['verdict']), str(body.get('scholar', ''))
    except KeyError as e:
      raise images.Refused(422, f'decision: field {e} missing; expected a, b, verdict, scholar')
    if a == b:
      raise images.Refused(422, 'decision: a and b are the same image; expected a pair')
    (a_size, a_mtime), (b_size, b_mtime) = bench.check_unchanged(a), bench.check_unchanged(b)
    distance, rank = body.get('distance'), body.get('rank')
    kept = bench.decisions.add(db_lib.Decision(
        a=a, b=b, a_size=a_size, a_mtime_ns=a_mtime, b_size=b_size, b_mtime_ns=b_mtime,
        verdict=verdict, note=str(body.get('note', '')), scholar=scholar,
        distance=None if distance is None else float(distance),
        rank=None if rank is None else int(rank),
        checkpoint=bench.index.header.get('checkpoint') or ''))
    return _json_decision(kept)

  @app.post('/api/decisions/{decision_id}/undo')
  def undo(decision_id: int, body: dict = fastapi.Body(default={})):
    return _json_decision(bench.decisions.undo(decision_id, str(body.get('scholar', ''))))

  @app.get('/api/decisions')
  def decisions():
    """The standing decisions, newest first, each with its pair's dissent and history."""
    earlier, dissent, standing = {}, {}, []
    for d, status, _ in db_lib.history(bench.decisions.all(undone=True)):
      if status == 'standing':
        standing.append(d)
      else:
        earlier.setdefault((d.a, d.b), []).append(dict(verdict=d.verdict, scholar=d.scholar,
                                                       decided_at=d.decided_at, status=status))
      if status == 'dissent':
        dissent.setdefault((d.a, d.b), []).append(dict(verdict=d.verdict, scholar=d.scholar))
    return dict(decisions=[_json_decision(d) | dict(dissent=dissent.get((d.a, d.b), []),
                                                    history=earlier.get((d.a, d.b), []))
                           for d in reversed(standing)])

  def _download(text, media, suffix):
    return responses.Response(text, media_type=media, headers={
        'Content-Disposition': f'attachment; filename="decisions.{suffix}"'})

  @app.get('/api/export.csv')
  def export_csv():
    return _download(exchange.to_csv(bench.decisions.all(undone=True)), 'text/csv', 'csv')

  @app.get('/api/export.jsonld')
  def export_jsonld():
    label = f'Decisions on candidate joins of {bench.root}'
    return _download(exchange.to_jsonld(bench.decisions.all(undone=True), label),
                     'application/ld+json', 'jsonld')

  @app.post('/api/import')
  async def import_(request: fastapi.Request, name: str = 'import'):
    data = await images.read_limited(request.stream(), settings.max_upload_bytes, name)
    incoming = exchange.parse(name, data)  # all checked before anything is added
    return await run_in_threadpool(exchange.merge, bench.decisions, incoming, f'import: {name}')

  @app.get('/api/groups')
  def groups():
    return dict(groups=db_lib.groups(bench.decisions.standing()))

  return app
