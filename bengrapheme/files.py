"""Writing outputs into a workdir that may be a local folder or a bucket (gs://, s3://).

etils.epath (already installed with Orbax) reaches buckets through fsspec (pip install gcsfs
for gs://), so one code path serves a laptop, a SLURM cluster's shared disk and a TPU pod.
"""
import io
import os

import numpy as np
from etils import epath


def write_atomic(path, data):
  """Writes str or bytes to `path` whole or not at all (a temporary file, then a rename), so a
  crash never leaves a truncated file that looks complete."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / (path.name + '.tmp')
  tmp.write_bytes(data if isinstance(data, bytes) else data.encode('utf-8'))
  tmp.replace(path)
  return str(path)


def read_text(path):
  """The text of `path`, or None when it does not exist."""
  path = epath.Path(path)
  return path.read_bytes().decode('utf-8') if path.exists() else None


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


def exists(path):
  return epath.Path(path).exists()


def save_npy(path, array):
  """np.save, atomically, to a local or bucket path."""
  buffer = io.BytesIO()
  np.save(buffer, array)
  return write_atomic(path, buffer.getvalue())


def load_npy(path):
  return np.load(io.BytesIO(epath.Path(path).read_bytes()))


def copy_in(local_path, path):
  """Moves a finished local file to `path` (a bucket cannot be written by local-file APIs)."""
  if '://' in str(path):
    epath.Path(local_path).copy(epath.Path(path), overwrite=True)
    os.remove(local_path)
  else:
    os.replace(local_path, path)
  return str(path)
