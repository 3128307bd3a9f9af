"""Writing outputs into a workdir that may be a local folder or a bucket (gs://, s3://).

etils.epath (already installed with Orbax) reaches buckets through fsspec (pip install gcsfs
for gs://), so one code path serves a laptop, a SLURM cluster's shared disk and a TPU pod.
"""
from etils import epath


def write_atomic(path, data):
  """Writes str or bytes to `path` whole or not at all (a temporary file, then a rename), so a
  crash never leaves a truncated file that looks complete."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / (path.name + '.tmp')
  if isinstance(data, bytes):
    tmp.write_bytes(data)
  else:
    tmp.write_text(data)
  tmp.replace(path)
  return str(path)


def read_text(path):
  """The text of `path`, or None when it does not exist."""
  path = epath.Path(path)
  return path.read_text() if path.exists() else None


def join(*parts):
  return str(epath.Path(parts[0]).joinpath(*parts[1:]))


def prepared_dir(config, workdir):
  """Where the prepared (decoded, memory-mapped) data goes: config.data.cache_dir, else
  WORKDIR/prepared. A memory map needs a local disk, so a bucket workdir needs cache_dir."""
  if config.data.cache_dir:
    return config.data.cache_dir
  if '://' in workdir:
    raise ValueError(f'--workdir {workdir} is a bucket, but the prepared data is memory-mapped '
                     'and must be on a local disk: set --config.data.cache_dir=/local/folder')
  return str(epath.Path(workdir) / 'prepared')
