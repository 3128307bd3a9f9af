"""The scholars' workbench (launch.serve): a local web app over an index, where candidate joins
are looked at side by side, decided, kept in SQLite (retrieval/collections/decisions.py),
exported, merged with a colleague's (exchange.py), grouped (decisions.groups) and, later,
learned from.

  exchange.py  CSV and W3C Web Annotation (JSON-LD) export and import
  images.py    which files may be served (only under the indexed root), uploads checked
  app.py       the FastAPI app: collection, search, rounds of candidate joins, decisions
  static/      the one page and its script
"""
