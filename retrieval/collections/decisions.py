"""The scholars' decisions on candidate joins, kept in SQLite.

One row a decision, never rewritten but for its undo (time and scholar): a decision is never
lost, only replaced or undone, and its history is what is kept and exported. A pair's
decisions are read in the order they were made (decided_at, then the UUID, so that every
copy of the database orders them alike): each replaces the one before it not undone, and the
newest not undone stands. Each scholar's newest decision on a pair that disagrees with the
standing one is that scholar's dissent, kept (it is a row like any other), shown and exported.
Since the standing verdict depends only on the set of decisions and which are undone, two
databases holding the same decisions agree, whatever order they learned them in
(exchange.merge).

Each row holds what is needed to trust it later: both paths (relative to the indexed folder,
the pair ordered by path), their sizes and modification times as indexed, the distance and
rank the pair was shown at, the index's checkpoint digest, the time (UTC) and the scholar's
name, and a UUID that identifies it across exports and imports.

WAL mode with synchronous=FULL and one transaction a decision: a decision the app has
acknowledged is on disk, and survives the server being killed the next instant. The schema
version is SQLite's user_version; an older database is brought up to this version when
opened, one from a newer version is refused, not guessed at.
"""
import contextlib
import dataclasses
import datetime
import os
import sqlite3
import uuid as uuid_lib

from bengrapheme import errors

SCHEMA_VERSION = 2
VERDICTS = ('same', 'different', 'unsure')  # same hand / different hands / unsure

SCHEMA = """
CREATE TABLE decisions (
  id INTEGER PRIMARY KEY,
  uuid TEXT NOT NULL UNIQUE,
  a TEXT NOT NULL, b TEXT NOT NULL,
  a_size INTEGER NOT NULL, a_mtime_ns INTEGER NOT NULL,
  b_size INTEGER NOT NULL, b_mtime_ns INTEGER NOT NULL,
  verdict TEXT NOT NULL CHECK (verdict IN ('same', 'different', 'unsure')),
  note TEXT NOT NULL DEFAULT '',
  scholar TEXT NOT NULL,
  distance REAL, rank INTEGER,
  checkpoint TEXT NOT NULL,
  decided_at TEXT NOT NULL,
  origin TEXT NOT NULL DEFAULT '',
  undone_at TEXT,
  undone_by TEXT,
  CHECK (a < b)
);
CREATE INDEX decisions_pair ON decisions (a, b);
"""
# What each older schema lacks, by the version it was.
UPGRADES = {1: 'ALTER TABLE decisions ADD COLUMN undone_by TEXT;'}
COLUMNS = ('uuid', 'a', 'b', 'a_size', 'a_mtime_ns', 'b_size', 'b_mtime_ns', 'verdict', 'note',
           'scholar', 'distance', 'rank', 'checkpoint', 'decided_at', 'origin', 'undone_at',
           'undone_by')


@dataclasses.dataclass
class Decision:
  a: str
  b: str
  a_size: int
  a_mtime_ns: int
  b_size: int
  b_mtime_ns: int
  verdict: str
  note: str
  scholar: str
  distance: float | None
  rank: int | None
  checkpoint: str
  decided_at: str = ''
  uuid: str = ''
  origin: str = ''  # '' here; 'import: FILE' for a colleague's
  undone_at: str | None = None
  undone_by: str | None = None
  id: int | None = None

  def ordered(self):
    """The same decision with its pair ordered by path (a < b), as the table keeps it."""
    if self.a < self.b:
      return self
    return dataclasses.replace(self, a=self.b, b=self.a, a_size=self.b_size,
                               a_mtime_ns=self.b_mtime_ns, b_size=self.a_size,
                               b_mtime_ns=self.a_mtime_ns)


def now():
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='microseconds')


def utc(text):
  """The ISO 8601 time `text` (with its offset) as now() writes it, so that times from any
  machine order as text; ValueError when it is not such a time."""
  moment = datetime.datetime.fromisoformat(text)
  if moment.tzinfo is None:
    raise ValueError(f'{text!r} has no UTC offset')
  return moment.astimezone(datetime.timezone.utc).isoformat(timespec='microseconds')


class Decisions:
  """The database at `path`, created with the current schema when new."""

  def __init__(self, path):
    self.path = path
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
      raise errors.UserError(f'{path}: its folder {folder} does not exist; expected a path for '
                             'the decisions database (--db)')
    with self._connect() as db:
      version = db.execute('PRAGMA user_version').fetchone()[0]
      tables = db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
      if version > SCHEMA_VERSION:
        raise errors.UserError(f'{path}: decisions schema version {version}, this version '
                               f'reads {SCHEMA_VERSION}; use the newer bengrapheme that wrote it')
      if version == 0 and tables:
        raise errors.UserError(f'{path}: an SQLite file that is not a decisions database '
                               '(no schema version); give another --db')
      if version == 0:
        db.executescript(f'BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;')
      elif version < SCHEMA_VERSION:
        steps = ' '.join(UPGRADES[v] for v in range(version, SCHEMA_VERSION))
        db.executescript(f'BEGIN; {steps} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;')

  @contextlib.contextmanager
  def _connect(self):
    """A connection for one operation: FastAPI runs requests on several threads."""
    try:
      db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
      db.execute('PRAGMA journal_mode=WAL')
      db.execute('PRAGMA synchronous=FULL')  # an acknowledged decision is on disk
    except sqlite3.DatabaseError as e:
      raise errors.UserError(f'{self.path}: not an SQLite database ({e}); give another --db')
    db.row_factory = sqlite3.Row
    try:
      yield db
    finally:
      db.close()

  def add(self, decision):
    """Keeps `decision` in one transaction; returns it as kept (id, uuid, time)."""
    d = decision.ordered()
    if d.verdict not in VERDICTS:
      raise errors.UserError(f'verdict {d.verdict!r}: expected one of {", ".join(VERDICTS)}')
    if not d.scholar.strip():
      raise errors.UserError("scholar: expected the scholar's name")
    d = dataclasses.replace(d, uuid=d.uuid or str(uuid_lib.uuid4()),
                            decided_at=d.decided_at or now())
    with self._connect() as db:
      db.execute('BEGIN IMMEDIATE')
      cursor = db.execute(
          f'INSERT INTO decisions ({", ".join(COLUMNS)}) VALUES '
          f'({", ".join("?" * len(COLUMNS))})', [getattr(d, c) for c in COLUMNS])
      db.execute('COMMIT')
    return dataclasses.replace(d, id=cursor.lastrowid)

  def undo(self, decision_id, scholar='', at=None, by_uuid=False):
    """Marks the decision (its id, or its UUID when `by_uuid`) undone by `scholar` at `at`
    (now when None): the pair's decision before it stands again, or the pair goes back to the
    queue. Returns it; UserError when there is no such decision standing."""
    key = 'uuid' if by_uuid else 'id'
    with self._connect() as db:
      db.execute('BEGIN IMMEDIATE')
      changed = db.execute(f'UPDATE decisions SET undone_at = ?, undone_by = ? WHERE {key} = ? '
                           'AND undone_at IS NULL', (at or now(), scholar, decision_id)).rowcount
      db.execute('COMMIT')
      row = db.execute(f'SELECT * FROM decisions WHERE {key} = ?', (decision_id,)).fetchone()
    if not changed:
      raise errors.UserError(f'decision {decision_id}: ' +
                             ('already undone' if row else 'no such decision'))
    return _decision(row)

  def all(self, undone=False):
    """Every decision in the order they were made; the undone ones too when `undone`."""
    with self._connect() as db:
      rows = db.execute('SELECT * FROM decisions' + ('' if undone else
                        ' WHERE undone_at IS NULL') + ' ORDER BY decided_at, uuid').fetchall()
    return [_decision(r) for r in rows]

  def standing(self):
    """{(a, b): the pair's standing decision}: its newest not undone."""
    return {(d.a, d.b): d for d in self.all()}  # in the order made: the newest wins

  def uuids(self):
    """{uuid: whether that decision is undone}."""
    with self._connect() as db:
      return {r[0]: r[1] is not None for r in db.execute('SELECT uuid, undone_at FROM '
                                                           'decisions')}


def history(decisions):
  """[(decision, status, replaced_by)] of `decisions` (all of them, undone too, in the order
  made): status 'standing', 'replaced' (a newer decision on its pair stands), 'dissent' (its
  scholar's newest on the pair, disagreeing with the standing one: a scholar dissents until
  they decide again) or 'undone'; replaced_by the UUID of the pair's next decision not
  undone (None for the standing and the undone)."""
  kept = [d for d in decisions if d.undone_at is None]
  following, last = {}, {}
  for d in kept:
    if (d.a, d.b) in last:
      following[last[(d.a, d.b)]] = d.uuid
    last[(d.a, d.b)] = d.uuid
  standing = last
  by_uuid = {d.uuid: d for d in kept}
  newest_of = {(d.a, d.b, d.scholar): d.uuid for d in kept}
  out = []
  for d in decisions:
    if d.undone_at is not None:
      status = 'undone'
    elif standing[(d.a, d.b)] == d.uuid:
      status = 'standing'
    elif (newest_of[(d.a, d.b, d.scholar)] == d.uuid and
          d.verdict != by_uuid[standing[(d.a, d.b)]].verdict):
      status = 'dissent'
    else:
      status = 'replaced'
    out.append((d, status, following.get(d.uuid) if status != 'undone' else None))
  return out


def dissent(decisions):
  """{(a, b): [the dissenting decisions]} of the pairs where a scholar's newest decision
  disagrees with the standing one (history's 'dissent')."""
  out = {}
  for d, status, _ in history(decisions):
    if status == 'dissent':
      out.setdefault((d.a, d.b), []).append(d)
  return out


def _decision(row):
  return Decision(**{k: row[k] for k in row.keys()})


def groups(decisions):
  """The groups of fragments joined by standing 'same' decisions, transitively (union-find):
  [[path, ...], ...], each sorted, the largest groups first."""
  parent = {}

  def find(x):
    parent.setdefault(x, x)
    while parent[x] != x:
      parent[x] = parent[parent[x]]  # path halving keeps the trees shallow
      x = parent[x]
    return x

  for d in decisions.values():
    if d.verdict == 'same':
      parent[find(d.a)] = find(d.b)
  members = {}
  for x in parent:
    members.setdefault(find(x), []).append(x)
  return sorted((sorted(m) for m in members.values()), key=lambda m: (-len(m), m))
