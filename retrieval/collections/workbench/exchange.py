"""Decisions out and in: CSV, and W3C Web Annotation JSON-LD (an AnnotationCollection, one
Annotation a decision, as the Princeton Geniza Project exchanges its annotations).

An export holds every decision, the undone and the replaced too, each with its status
(decisions.history: standing, replaced, dissent, undone), the UUID of the decision that
replaced it, and who undid it when. An import merges a colleague's export into the database
and loses nothing: each decision not yet here (by its UUID) is added with its origin, in the
order the decisions were made, and an undo made there is made here; the pair's newest
decision not undone stands, as everywhere, and a scholar who disagrees with it keeps their
dissent on the pair. So importing A's export into B and B's into A leaves both with the same
standing verdicts. A file that is not such an export is refused whole, in one line naming the
file, the row and the field, before anything is added.
"""
import dataclasses
import csv
import io
import json

from bengrapheme import errors
from retrieval.collections import decisions as db_lib

CSV_COLUMNS = ('uuid', 'a', 'b', 'verdict', 'note', 'scholar', 'decided_at', 'distance',
               'rank', 'a_size', 'a_mtime_ns', 'b_size', 'b_mtime_ns', 'checkpoint')
# Written by every export; an export without them (an older one) reads as nothing undone.
# status and replaced_by are for the reader, as are the identifiers: an import derives them
# again (a decision is on two paths of the collection).
HISTORY_COLUMNS = ('status', 'replaced_by', 'undone_at', 'undone_by')
CITED_COLUMNS = ('a_shelfmark', 'a_iri', 'a_xywh', 'b_shelfmark', 'b_iri', 'b_xywh',
                 'collection')
# W3C Web Annotation has no terms for these; they go under their own prefix.
CONTEXT = ['http://www.w3.org/ns/anno.jsonld', {'bg': 'urn:bengrapheme:decision#'}]
LABELS = {'same': 'same hand', 'different': 'different hands', 'unsure': 'unsure'}
INTEGERS = ('rank', 'a_size', 'a_mtime_ns', 'b_size', 'b_mtime_ns')


def to_csv(decisions, identifiers=None, collection=''):
  """`decisions`: all of them, undone too, in the order made (Decisions.all(undone=True));
  identifiers: {path: collection.Identifier} of those the collection names; collection: its
  stable id."""
  identifiers = identifiers or {}
  out = io.StringIO()
  writer = csv.DictWriter(out, CSV_COLUMNS + HISTORY_COLUMNS + CITED_COLUMNS,
                          lineterminator='\n')
  writer.writeheader()
  for d, status, replaced_by in db_lib.history(decisions):
    row = {c: getattr(d, c) for c in CSV_COLUMNS + ('undone_at', 'undone_by')}
    row.update(status=status, replaced_by=replaced_by, collection=collection)
    for side in ('a', 'b'):
      known = identifiers.get(getattr(d, side))
      if known:
        row.update({f'{side}_shelfmark': known.shelfmark, f'{side}_iri': known.iri,
                    f'{side}_xywh': known.xywh})
    writer.writerow({c: '' if v is None else v for c, v in row.items()})
  return out.getvalue()


def _target(path, size, mtime_ns, known):
  """A W3C target: the canvas (a region of it, by a media fragment selector) the image stands
  for when the collection names one, else the image's path in the collection."""
  own = {'bg:path': path, 'bg:size': size, 'bg:mtimeNs': mtime_ns}
  if not known:
    return {'source': path} | own
  target = {'type': 'SpecificResource', 'source': {'id': known.iri, 'type': 'Canvas'},
            'bg:shelfmark': known.shelfmark} | own
  if known.xywh:
    target['selector'] = {'type': 'FragmentSelector',
                          'conformsTo': 'http://www.w3.org/TR/media-frags/',
                          'value': f'xywh={known.xywh}'}
  return target


def to_jsonld(decisions, label, identifiers=None, collection='', checkpoint=''):
  """`decisions`, identifiers and collection as to_csv's; checkpoint: the digest of the
  checkpoint whose distances the workbench shows now (each decision keeps its own)."""
  identifiers = identifiers or {}
  items = []
  for d, status, replaced_by in db_lib.history(decisions):
    body = [{'type': 'TextualBody', 'purpose': 'classifying', 'value': LABELS[d.verdict]}]
    if d.note:
      body.append({'type': 'TextualBody', 'purpose': 'commenting', 'value': d.note})
    items.append({
        'id': f'urn:uuid:{d.uuid}', 'type': 'Annotation', 'motivation': 'linking',
        'created': d.decided_at, 'creator': {'type': 'Person', 'name': d.scholar},
        'body': body,
        'target': [_target(d.a, d.a_size, d.a_mtime_ns, identifiers.get(d.a)),
                   _target(d.b, d.b_size, d.b_mtime_ns, identifiers.get(d.b))],
        'bg:distance': d.distance, 'bg:rank': d.rank, 'bg:checkpoint': d.checkpoint,
        'bg:status': status})
    if replaced_by:
      items[-1]['bg:replacedBy'] = f'urn:uuid:{replaced_by}'
    if d.undone_at:
      items[-1]['bg:undone'] = {'created': d.undone_at,
                                'creator': {'type': 'Person', 'name': d.undone_by or ''}}
  return json.dumps({'@context': CONTEXT, 'type': 'AnnotationCollection', 'label': label,
                     'bg:collection': collection, 'bg:checkpoint': checkpoint,
                     'total': len(items), 'first': {'type': 'AnnotationPage', 'items': items}},
                    indent=1, ensure_ascii=False) + '\n'


def _field(name, where, field, value, kind):
  """`value` of `field` as `kind` (int, float or a verdict), or a one-line UserError."""
  try:
    if kind == 'verdict':
      if value not in db_lib.VERDICTS:
        raise ValueError
      return value
    if value in ('', None) and field in ('distance', 'rank', 'undone_at', 'undone_by'):
      return None
    if kind == 'time':
      return db_lib.utc(value)
    return kind(value)
  except (TypeError, ValueError):
    expected = {'verdict': 'one of ' + ', '.join(db_lib.VERDICTS), int: 'an integer',
                float: 'a number', str: 'text',
                'time': 'an ISO 8601 time with its UTC offset (2026-03-01T12:00:00+00:00)'}[kind]
    raise errors.UserError(f'{name}: {where}: field {field}: {value!r}, expected {expected}')


def _decision(name, where, fields):
  kinds = dict.fromkeys(CSV_COLUMNS, str) | dict.fromkeys(INTEGERS, int) | {
      'distance': float, 'verdict': 'verdict', 'decided_at': 'time', 'undone_at': 'time',
      'undone_by': str}
  values = {c: _field(name, where, c, fields.get(c), kinds[c]) for c in kinds}
  for c in ('uuid', 'a', 'b', 'scholar'):
    if not values[c]:
      raise errors.UserError(f'{name}: {where}: field {c}: empty, expected a value')
  if values['a'] == values['b']:
    raise errors.UserError(f'{name}: {where}: fields a and b: the same file, expected a pair')
  return db_lib.Decision(**values).ordered()


def from_csv(name, text):
  reader = csv.DictReader(io.StringIO(text))
  missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
  if missing:
    raise errors.UserError(f'{name}: CSV header lacks {", ".join(missing)}; expected a '
                           'decisions export (columns ' + ','.join(CSV_COLUMNS) + ')')
  return [_decision(name, f'row {n}', row) for n, row in enumerate(reader, 2)]


def from_jsonld(name, text):
  try:
    items = json.loads(text)['first']['items']
    if not isinstance(items, list):
      raise TypeError
  except (ValueError, KeyError, TypeError) as e:
    raise errors.UserError(f'{name}: not a Web Annotation collection of decisions ({e!r}); '
                           'expected the JSON-LD this workbench exports')
  out = []
  for n, item in enumerate(items, 1):
    where = f'annotation {n}'
    try:
      labels = {v: k for k, v in LABELS.items()}
      bodies = {b['purpose']: b['value'] for b in item['body']}
      a, b = item['target']
      fields = dict(uuid=item['id'].removeprefix('urn:uuid:'), a=a.get('bg:path', a['source']),
                    b=b.get('bg:path', b['source']),
                    verdict=labels.get(bodies.get('classifying')),
                    note=bodies.get('commenting', ''), scholar=item['creator']['name'],
                    decided_at=item['created'], distance=item.get('bg:distance'),
                    rank=item.get('bg:rank'), a_size=a['bg:size'], a_mtime_ns=a['bg:mtimeNs'],
                    b_size=b['bg:size'], b_mtime_ns=b['bg:mtimeNs'],
                    checkpoint=item.get('bg:checkpoint', ''),
                    undone_at=item.get('bg:undone', {}).get('created'),
                    undone_by=item.get('bg:undone', {}).get('creator', {}).get('name'))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise errors.UserError(f'{name}: {where}: lacks {e}; expected an annotation this '
                             'workbench exports (two targets, a classifying body)')
    out.append(_decision(name, where, fields))
  return out


def parse(name, data):
  """The decisions of an export file's bytes (CSV or JSON-LD, told apart by content)."""
  try:
    text = data.decode('utf-8-sig')
  except UnicodeDecodeError:
    raise errors.UserError(f'{name}: not UTF-8 text; expected a CSV or JSON-LD export')
  return from_jsonld(name, text) if text.lstrip().startswith('{') else from_csv(name, text)


def merge(decisions_db, incoming, origin):
  """Adds `incoming` (parsed, all of them checked) to the database in the order they were
  made, and makes here the undos made there. Returns dict(added, already, undone, changed:
  [{a, b, was, now, by}] the pairs whose standing verdict the import changed, dissent:
  [{a, b, standing, by, dissent: [{verdict, scholar}]}] the imported pairs scholars disagree on).
  """
  known, before = decisions_db.uuids(), decisions_db.standing()
  added, already, undone = 0, 0, 0
  for d in sorted(incoming, key=lambda d: (d.decided_at, d.uuid)):
    if d.uuid not in known:
      decisions_db.add(dataclasses.replace(d, origin=origin, id=None))
      added += 1
    elif d.undone_at and not known[d.uuid]:
      decisions_db.undo(d.uuid, d.undone_by or '', d.undone_at, by_uuid=True)
      undone += 1
    else:
      already += 1
    known[d.uuid] = known.get(d.uuid) or d.undone_at is not None
  everything = decisions_db.all(undone=True)
  after = {(d.a, d.b): d for d in everything if d.undone_at is None}
  pairs = sorted({(d.a, d.b) for d in incoming})
  verdict = lambda standing, pair: standing[pair].verdict if pair in standing else None
  changed = [dict(a=a, b=b, was=verdict(before, (a, b)), now=verdict(after, (a, b)),
                  by=after[(a, b)].scholar if (a, b) in after else None)
             for a, b in pairs if verdict(before, (a, b)) != verdict(after, (a, b))]
  dissent = [dict(a=a, b=b, standing=after[(a, b)].verdict, by=after[(a, b)].scholar,
                  dissent=[dict(verdict=d.verdict, scholar=d.scholar) for d in ds])
             for (a, b), ds in sorted(db_lib.dissent(everything).items()) if (a, b) in pairs]
  return dict(added=added, already=already, undone=undone, changed=changed, dissent=dissent)
