"""Finds the images of an indexed collection closest to query images, or the closest pairs.

  python -m launch.search --workdir W --query FILE [FILE ...] [--top 20]
  python -m launch.search --workdir W --query-collection [--top 20]

Prints each query's nearest images (path and distance; lower is closer) and writes one
self-contained HTML page (--out; default INDEX/search.html) of each query beside its
matches, every image at one scale. A query may be inside the collection (it does not match
itself) or anywhere else (it is embedded with the index's checkpoint and settings).
--query-collection ranks every image against every other and shows the --top closest
pairs: the candidate joins to check first.
"""
import os

from absl import flags

from launch import cli

WORKDIR = flags.DEFINE_string('workdir', None, 'The workdir launch.index indexed with.')
INDEX = flags.DEFINE_string('index', None, 'The index folder (default: WORKDIR/index).')
QUERY = flags.DEFINE_multi_string(
    'query', [], 'A query image, or several: --query A.jpg B.png')
QUERY_COLLECTION = flags.DEFINE_bool(
    'query-collection', False, 'Rank every image against every other: the closest pairs.')
TOP = flags.DEFINE_integer('top', 20, 'Matches shown per query, or pairs shown.', lower_bound=1)
OUT = flags.DEFINE_string('out', None, 'The HTML page (default: INDEX/search.html).')
flags.mark_flag_as_required('workdir')


def main(argv):
  from absl import logging
  from bengrapheme import console, errors
  from retrieval.collections import search
  logging.set_verbosity(logging.WARNING)  # as the other entry points: no Orbax INFO lines
  queries = QUERY.value + argv[1:]
  if bool(queries) == QUERY_COLLECTION.value:
    raise errors.UserError('give either --query FILE [FILE ...] or --query-collection')
  folder = INDEX.value or os.path.join(WORKDIR.value, 'index')
  out = OUT.value or os.path.join(folder, 'search.html')
  if QUERY_COLLECTION.value:
    text = search.search_collection(folder, TOP.value, out)
  else:
    text = search.search_files(WORKDIR.value, folder, queries, TOP.value, out)
  console.show(f'{text}\nPage: {out}')


if __name__ == '__main__':
  cli.run(main)
