"""The workbench's web app (FastAPI): one page (static/) and the JSON it reads.

  GET  /                          the page
  GET  /api/info                  the index, the database, the counts of decisions
  GET  /api/shelfmarks            {path: shelfmark} of the images the collection names
  GET  /api/items?page=&per=&q=   the collection, paged (q: a part of the path)
  GET  /image?path=&size=&cutout=  an indexed image as PNG (size: longest side, 0 full;
                                  cutout: outside the fragment transparent)
  GET  /api/image-info?path=      its size, resolution, shelfmark and IRI (the joining table)
  GET  /api/search?path=&top=     an indexed image's nearest
  POST /api/search/upload?name=   an image's nearest (the body: the image file)
  GET  /api/round?size=&path=&unsure=  the next round of candidate joins (path: one image's;
                                  unsure: the pairs left 'unsure')
  POST /api/decisions             {a, b, verdict, note, scholar, distance, rank}
  POST /api/decisions/ID/undo     {scholar}
  GET  /api/decisions             the standing decisions, newest first, with dissent
  GET  /api/export.csv, /api/export.jsonld
  POST /api/import?name=          a colleague's export (the body: the file)
  GET  /api/groups                fragments joined by 'same hand', transitively

The index is read again when index.npz changes (launch.index rebuilt it): the next request
sees the new one, without a restart.

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
import pathlib
import tempfile
import threading

import fastapi
from fastapi import exceptions, responses
from starlette.concurrency import run_in_threadpool

from bengrapheme import errors
from retrieval.collections import index as index_lib, search
from retrieval.collections import collection, decisions as db_lib
from retrieval.collections.workbench import exchange, images, rounds

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'static')
# OpenSeadragon, at the version static/package-lock.json pins (make workbench-viewer).
VIEWER = os.path.join(STATIC, 'node_modules', 'openseadragon', 'build', 'openseadragon',
                      'openseadragon.min.js')
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


class Indexed:
  """One index as served: it, its search, its identifiers, its candidate pairs. A request
  reads one Indexed throughout (Workbench.current), so that a rebuilt index replacing it
  mid-request cannot mix one index's rows with another's paths."""

  def __init__(self, settings, path, embedding):
    self.settings, self.embedding = settings, embedding
    self.index = index_lib.load(path)
    self.root = self.index.header['root']
    self.paths = self.index.entries.paths.tolist()
    self.row_of = {p: r for r, p in enumerate(self.paths)}
    self.searcher = search.Searcher.of(self.index)
    ident, known = collection.read_identifiers(self.root)
    # A folder that names no stable id is named by where it is.
    self.collection_id = ident or pathlib.Path(self.root).resolve().as_uri()
    self.identifiers = {p: known[p] for p in self.paths if p in known}
    self._candidates, self._ranking = None, threading.Lock()
    self._model = None  # (config, model) of the index's checkpoint, restored at an upload

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
    """An image's nearest, each with its rank among the `of` other images of the index."""
    return [dict(path=self.paths[j], distance=round(float(d), 4), rank=k,
                 of=len(self.paths) - 1)
            for k, (j, d) in enumerate(zip(rows.tolist(), dist.tolist()), 1)]

  def search_upload(self, name, data, top):
    """The nearest of an uploaded image, embedded with the index's checkpoint and settings
    (retrieval/collections/search.py's path for a query outside the collection). The file
    lives in a temporary folder for the embedding only."""
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


class Workbench:
  """What the app serves: the current index (an Indexed), the database."""

  def __init__(self, settings):
    self.settings = settings
    self.decisions = db_lib.Decisions(settings.db)
    self._loading = threading.Lock()
    self.embedding = threading.Lock()  # one upload embedded at a time: the model is large
    self.current, self.loaded_stamp, self.reloaded_at = None, None, None
    self.refresh()

  def refresh(self):
    """Loads the index when index.npz is new or was rebuilt since it was loaded (its size and
    time differ): a rebuilt index is served from the next request on, without a restart.
    Returns whether it loaded."""
    path = os.path.join(self.settings.folder, 'index.npz')
    try:
      stat = os.stat(path)
    except FileNotFoundError:
      if self.loaded_stamp is None:
        raise
      return False  # being rebuilt (launch.index writes it whole, then renames): keep this one
    stamp = stat.st_size, stat.st_mtime_ns
    if stamp == self.loaded_stamp:
      return False
    with self._loading:
      if stamp == self.loaded_stamp:
        return False
      self.current = Indexed(self.settings, path, self.embedding)  # one assignment: atomic
      if self.loaded_stamp is not None:
        self.reloaded_at = db_lib.now()
      self.loaded_stamp = stamp
    return True

  # What launch.serve and the benchmarks read of the current index.
  def candidates(self):
    return self.current.candidates()

  @property
  def paths(self):
    return self.current.paths

  @property
  def root(self):
    return self.current.root

  @property
  def searcher(self):
    return self.current.searcher


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

  @app.exception_handler(exceptions.RequestValidationError)
  async def bad_request(request, e):
    """One line naming the field, not FastAPI's structure of it."""
    problems = '; '.join(f'{".".join(str(x) for x in p["loc"][1:]) or p["loc"][0]}: '
                         f'{p["msg"]}' for p in e.errors())
    return responses.JSONResponse({'error': f'{request.url.path}: {problems}'}, 422)

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
    if request.url.path != '/' and not request.url.path.startswith('/static/'):
      await run_in_threadpool(bench.refresh)
    response = await call_next(request)
    if settings.token and request.query_params.get('token'):
      response.set_cookie(COOKIE, settings.token, httponly=True, samesite='strict')
    return response

  @app.get('/')
  def page():
    return responses.FileResponse(os.path.join(STATIC, 'index.html'))

  @app.get('/static/{name}')
  def static(name: str):
    if name == 'openseadragon.min.js':
      if not os.path.isfile(VIEWER):
        raise images.Refused(404, f'{VIEWER}: missing; install the joining table\'s viewer '
                             'with make workbench-viewer')
      return responses.FileResponse(VIEWER, media_type='text/javascript')
    if name not in ('app.js', 'app.css'):
      raise images.Refused(404, f'{name}: no such file')
    return responses.FileResponse(os.path.join(STATIC, name))

  @app.get('/api/info')
  def info():
    cur = bench.current
    h = cur.index.header
    everything = bench.decisions.all(undone=True)
    counts = dict.fromkeys(db_lib.VERDICTS, 0)
    for d in bench.decisions.standing().values():
      counts[d.verdict] += 1
    return dict(images=len(cur.paths), root=h['root'], step=h['step'],
                checkpoint=h.get('checkpoint'), settings=h['settings'], db=settings.db,
                round_size=settings.round_size, candidates=len(cur._candidates or ()),
                decisions=sum(counts.values()), counts=counts,
                dissent=len(db_lib.dissent(everything)), reloaded_at=bench.reloaded_at,
                collection=cur.collection_id, identified=len(cur.identifiers))

  @app.get('/api/shelfmarks')
  def shelfmarks():
    """{path: shelfmark} of the images the collection names (collection.py)."""
    cur = bench.current
    return {p: i.shelfmark for p, i in cur.identifiers.items()}

  @app.get('/api/items')
  def items(page: int = 1, per: int = 48, q: str = ''):
    cur = bench.current
    per = max(1, min(per, 500))
    chosen = [p for p in cur.paths if q.lower() in p.lower()] if q else cur.paths
    pages = max(1, -(-len(chosen) // per))
    page = min(max(page, 1), pages)  # paging stops at either end
    start = (page - 1) * per
    return dict(total=len(chosen), page=page, pages=pages, per=per,
                paths=chosen[start:start + per])

  @app.get('/image')
  def image(path: str, size: int = 0, cutout: bool = False):
    cur = bench.current
    real = images.resolve(cur.root, path, cur.row_of)
    stat = os.stat(real)
    data = images.png(real, max(0, min(size, 4096)), (stat.st_size, stat.st_mtime_ns), cutout)
    return responses.Response(data, media_type='image/png',
                              headers={'Cache-Control': 'private, max-age=3600'})

  @app.get('/api/image-info')
  def image_info(path: str):
    """An indexed image's size in pixels and its resolution (pixels a centimetre; None when
    not known), for the joining table's one physical scale."""
    cur = bench.current
    real = images.resolve(cur.root, path, cur.row_of)
    width, height, ppcm = images.size_and_resolution(real)
    known = cur.identifiers.get(path)
    if known and known.ppcm:  # the collection's word over the file's tag
      ppcm = known.ppcm
    return dict(path=path, width=width, height=height, ppcm=ppcm,
                shelfmark=known.shelfmark if known else None, iri=known.iri if known else None)

  @app.get('/api/search')
  def search_item(path: str, top: int = 20):
    cur = bench.current
    r = cur.row(path)
    s = cur.searcher
    rows, dist = s.nearest(s.descriptors[[r]], s.lbp[[r]], max(1, min(top, 500)), exclude=[r])
    return dict(query=path, matches=cur.matches(rows[0], dist[0]))

  @app.post('/api/search/upload')
  async def search_upload(request: fastapi.Request, name: str = 'query', top: int = 20):
    cur = bench.current
    data = await images.read_limited(request.stream(), settings.max_upload_bytes, name)
    found = await run_in_threadpool(cur.search_upload, name, data, max(1, min(top, 500)))
    return dict(query=name, matches=found)

  @app.get('/api/round')
  def next_round(size: int = 0, path: str = '', unsure: bool = False):
    """The next round: the collection's closest undecided pairs, one image's nearest (path),
    or the pairs whose standing decision is 'unsure', oldest first (unsure). Each pair's rank
    is its place among the `of` pairs of its list."""
    cur = bench.current
    size = max(1, min(size or settings.round_size, 200))
    standing = bench.decisions.standing()
    n = len(cur.paths)
    if unsure:
      pairs = [dict(a=d.a, b=d.b, distance=d.distance, rank=d.rank, of=None, note=d.note,
                    scholar=d.scholar) for d in standing.values()
               if d.verdict == 'unsure' and d.a in cur.row_of and d.b in cur.row_of]
      return dict(pairs=pairs[:size], anchor=None, decided=len(standing), left=len(pairs))
    if path:
      pairs = rounds.image_round(cur.searcher, cur.paths, cur.row(path), set(standing),
                                 size)
      of = n - 1
    else:
      pairs = rounds.collection_round(cur.candidates(), cur.paths, set(standing), size)
      of = n * (n - 1) // 2
    return dict(pairs=[p | dict(of=of) for p in pairs], anchor=path or None,
                decided=len(standing), left=None)

  @app.post('/api/decisions')
  def decide(body: dict = fastapi.Body(...)):
    cur = bench.current
    try:
      a, b = str(body['a']), str(body['b'])
      verdict, scholar = str(body['verdict']), str(body.get('scholar', ''))
    except KeyError as e:
      raise images.Refused(422, f'decision: field {e} missing; expected a, b, verdict, scholar')
    if a == b:
      raise images.Refused(422, 'decision: a and b are the same image; expected a pair')
    (a_size, a_mtime), (b_size, b_mtime) = cur.check_unchanged(a), cur.check_unchanged(b)
    distance, rank = body.get('distance'), body.get('rank')
    kept = bench.decisions.add(db_lib.Decision(
        a=a, b=b, a_size=a_size, a_mtime_ns=a_mtime, b_size=b_size, b_mtime_ns=b_mtime,
        verdict=verdict, note=str(body.get('note', '')), scholar=scholar,
        distance=None if distance is None else float(distance),
        rank=None if rank is None else int(rank),
        checkpoint=cur.index.header.get('checkpoint') or ''))
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
    cur = bench.current
    return _download(exchange.to_csv(bench.decisions.all(undone=True), cur.identifiers,
                                     cur.collection_id), 'text/csv', 'csv')

  @app.get('/api/export.jsonld')
  def export_jsonld():
    cur = bench.current
    label = f'Decisions on candidate joins of {cur.collection_id}'
    return _download(exchange.to_jsonld(bench.decisions.all(undone=True), label,
                                        cur.identifiers, cur.collection_id,
                                        cur.index.header.get('checkpoint') or ''),
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
