"""Decisions out and in: CSV, and W3C Web Annotation JSON-LD (an AnnotationCollection, one
Annotation a decision, as the Princeton Geniza Project exchanges its annotations).

An import merges a colleague's export into the database and overwrites nothing: a decision
already here (its UUID) is left alone, one on a pair whose standing decision here says
otherwise is listed as a conflict and not added, the others are added with their origin.
A file that is not such an export is refused whole, in one line naming the file, the row
and the field, before anything is added.
"""
import csv
import io
import json

from bengrapheme import errors
from retrieval.collections import decisions as db_lib

CSV_COLUMNS = ('uuid', 'a', 'b', 'verdict', 'note', 'scholar', 'decided_at', 'distance',
               'rank', 'a_size', 'a_mtime_ns', 'b_size', 'b_mtime_ns', 'checkpoint')
# W3C Web Annotation has no terms for these; they go under their own prefix.
CONTEXT = ['http://www.w3.org/ns/anno.jsonld', {'bg': 'urn:bengrapheme:decision#'}]
LABELS = {'same': 'same hand', 'different': 'different hands', 'unsure': 'unsure'}
INTEGERS = ('rank', 'a_size', 'a_mtime_ns', 'b_size', 'b_mtime_ns')


def to_csv(decisions):
  out = io.StringIO()
  writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator='\n')
  writer.writeheader()
  for d in decisions:
    writer.writerow({c: '' if getattr(d, c) is None else getattr(d, c) for c in CSV_COLUMNS})
  return out.getvalue()


def to_jsonld(decisions, label):
  items = []
  for d in decisions:
    body = [{'type': 'TextualBody', 'purpose': 'classifying', 'value': LABELS[d.verdict]}]
    if d.note:
      body.append({'type': 'TextualBody', 'purpose': 'commenting', 'value': d.note})
    items.append({
        'id': f'urn:uuid:{d.uuid}', 'type': 'Annotation', 'motivation': 'linking',
        'created': d.decided_at, 'creator': {'type': 'Person', 'name': d.scholar},
        'body': body,
        'target': [{'source': d.a, 'bg:size': d.a_size, 'bg:mtimeNs': d.a_mtime_ns},
                   {'source': d.b, 'bg:size': d.b_size, 'bg:mtimeNs': d.b_mtime_ns}],
        'bg:distance': d.distance, 'bg:rank': d.rank, 'bg:checkpoint': d.checkpoint})
  return json.dumps({'@context': CONTEXT, 'type': 'AnnotationCollection', 'label': label,
                     'total': len(items), 'first': {'type': 'AnnotationPage', 'items': items}},
                    indent=1, ensure_ascii=False) + '\n'


def _field(name, where, field, value, kind):
  """`value` of `field` as `kind` (int, float or a verdict), or a one-line UserError."""
  try:
    if kind == 'verdict':
      if value not in db_lib.VERDICTS:
        raise ValueError
      return value
    if value in ('', None) and field in ('distance', 'rank'):
      return None
    return kind(value)
  except (TypeError, ValueError):
    expected = {'verdict': 'one of ' + ', '.join(db_lib.VERDICTS), int: 'an integer',
                float: 'a number', str: 'text'}[kind]
    raise errors.UserError(f'{name}: {where}: field {field}: {value!r}, expected {expected}')


def _decision(name, where, fields):
  kinds = dict.fromkeys(CSV_COLUMNS, str) | dict.fromkeys(INTEGERS, int) | {
      'distance': float, 'verdict': 'verdict'}
  values = {c: _field(name, where, c, fields.get(c), kinds[c]) for c in CSV_COLUMNS}
  for c in ('uuid', 'a', 'b', 'scholar', 'decided_at'):
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
      fields = dict(uuid=item['id'].removeprefix('urn:uuid:'), a=a['source'], b=b['source'],
                    verdict=labels.get(bodies.get('classifying')),
                    note=bodies.get('commenting', ''), scholar=item['creator']['name'],
                    decided_at=item['created'], distance=item.get('bg:distance'),
                    rank=item.get('bg:rank'), a_size=a['bg:size'], a_mtime_ns=a['bg:mtimeNs'],
                    b_size=b['bg:size'], b_mtime_ns=b['bg:mtimeNs'],
                    checkpoint=item.get('bg:checkpoint', ''))
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
  """Adds `incoming` (parsed, all of them checked) to the database; returns dict(added,
  already, conflicts: [{a, b, here, theirs, scholar}])."""
  known, standing = decisions_db.uuids(), decisions_db.standing()
  added, already, conflicts = 0, 0, []
  for d in incoming:
    here = standing.get((d.a, d.b))
    if d.uuid in known:
      already += 1
    elif here is not None and here.verdict != d.verdict:
      conflicts.append(dict(a=d.a, b=d.b, here=here.verdict, here_by=here.scholar,
                            theirs=d.verdict, theirs_by=d.scholar))
    else:
      kept = decisions_db.add(d.__class__(**{**d.__dict__, 'origin': origin, 'id': None}))
      known.add(kept.uuid)
      standing[(d.a, d.b)] = kept
      added += 1
  return dict(added=added, already=already, conflicts=conflicts)
