"""The N x N distance matrix as CSV, the form the HisFrag20 organisers accepted results in.

Written from the evaluator (eval/distances_SPLIT.csv) and read back by launch/score_distances.py
to score a matrix made by any method.
"""
import numpy as np

from bengrapheme import files


def write_distance_csv(path, distances, names, header=False):
  """Writes an N x N distance matrix as CSV in the layout the organisers' evaluator reads.

  Exactly: N lines; line i is `names[i]` followed by the N distances of row i, comma
  separated, the columns in the order of the rows; no header line. This is what
  anguelos/wi19_evaluate's `load_dm` parses (`line.split(",")`, the name first, then
  `float()` of every other field: a header line of names stops it). header=True adds a first
  line of an empty corner cell and the N names, which pandas reads with `index_col=0`.
  Each distance is printed with enough digits to read back bit-exact ('%.9g' for float32
  input, '%.17g' otherwise); '\\n' line ends. The file appears whole or not at all
  (bengrapheme/files.py), in a local folder or a bucket.
  """
  d = np.asarray(distances)
  if d.ndim != 2 or d.shape[0] != d.shape[1]:
    raise ValueError(f'distance matrix must be square, got shape {d.shape}')
  names = [str(s) for s in names]
  if len(names) != d.shape[0]:
    raise ValueError(f'{len(names)} names for a {d.shape[0]} x {d.shape[0]} matrix')
  if any((',' in s) or ('\n' in s) or ('\r' in s) or (s == '') for s in names):
    raise ValueError('names must be non-empty and contain no comma or line break')
  fmt = '%.9g' if d.dtype == np.float32 else '%.17g'
  line = ','.join([fmt] * d.shape[1]) + '\n'
  with files.atomic_file(path, 'w', newline='') as f:
    if header:
      f.write(',' + ','.join(names) + '\n')
    for name, row in zip(names, d):
      f.write(name + ',' + line % tuple(row.tolist()))
  return str(path)


def read_distance_csv(path):
  """Reads a distance CSV -> (float64 [N, N] distances, list of N names).

  Accepts the layout `write_distance_csv` writes (each line: name, then N distances) and a
  header layout (a first line of N names, optionally after one empty corner cell, then N lines
  of N distances, each optionally led by its name). Raises ValueError naming the file and line
  for a row of the wrong length, a field that is not a number, a row named differently from
  its header column, or a name given twice. NaN / Inf and asymmetry are
  `metrics_from_distances`'s to check.
  """
  with open(path, newline='') as f:
    lines = [(k, s) for k, s in enumerate(f.read().splitlines(), 1) if s.strip()]
  if not lines:
    raise ValueError(f'{path}: empty distance file')
  first = [s.strip() for s in lines[0][1].split(',')]
  header = None
  if not _all_numbers(first[1:]):
    header = first[1:] if first[0] == '' else first
    lines = lines[1:]
  n = len(lines)
  names, rows = [], []
  for r, (line, s) in enumerate(lines):
    fields = s.split(',')
    if len(fields) == n + 1 or not _all_numbers(fields[:1]):
      names.append((r, line, fields[0].strip()))
      fields = fields[1:]
    if len(fields) != n:
      raise ValueError(f'{path}: line {line} has {len(fields)} distances, expected {n}')
    try:
      rows.append(np.array(fields, np.float64))
    except ValueError:
      bad = next(x for x in fields if not _all_numbers([x]))
      raise ValueError(f'{path}: line {line}: {bad.strip()!r} is not a number; expected '
                       f'{n} distances') from None
  if header is not None:
    if len(header) != n:
      raise ValueError(f'{path}: header has {len(header)} names for {n} rows')
    for r, line, name in names:
      if name != header[r]:
        raise ValueError(f'{path}: line {line} is named {name!r} but column {r + 1} of the '
                         f'header is {header[r]!r}; expected the rows in the header\'s order')
    names = header
  elif len(names) != n:
    raise ValueError(f'{path}: every line must start with its name')
  else:
    names = [name for _, _, name in names]
  first_index = {}
  for k, name in enumerate(names):
    if name in first_index:
      raise ValueError(f'{path}: name {name!r} is given twice, for rows {first_index[name] + 1} '
                       f'and {k + 1} (counting from 1); expected each item once')
    first_index[name] = k
  return np.stack(rows), names


def _all_numbers(fields):
  try:
    [float(s) for s in fields]
  except ValueError:
    return False
  return True
