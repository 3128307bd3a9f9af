"""Outputs that appear whole or not at all, in a workdir that may be a local folder or a bucket.

Every file and folder the project writes goes through `atomic_file` or `atomic_dir`: the
content is written under a temporary name beside its destination, flushed to disk, then
renamed into place, so a crash (or a full disk) never leaves a truncated file or a half-built
folder under a name that looks complete. Temporaries are named `.tmp-NAME-PID@HOST`, so a
later run can tell one abandoned by a dead process from one still being written
(`remove_abandoned`).

etils.epath (already installed with Orbax) reaches buckets through fsspec (pip install gcsfs
for gs://), so one code path serves a laptop, a SLURM cluster's shared disk and a TPU pod.
An object store has no rename, but an object appears only once its upload completes: a file
for a bucket is written locally, then uploaded.
"""
import contextlib
import errno
import os
import pathlib
import shutil
import socket
import tempfile

import numpy as np
from etils import epath

from bengrapheme import errors

_TMP_PREFIX = '.tmp-'


def is_bucket(path):
  return '://' in str(path)


def temporary_name(name):
  """The name a file or folder `name` is built under, beside it."""
  return f'{_TMP_PREFIX}{name}-{os.getpid()}@{socket.gethostname()}'


@contextlib.contextmanager
def atomic_file(path, mode='w', **open_args):
  """Yields a file object whose content appears at `path` when the block ends without error;
  on an error the temporary is removed and `path` is left as it was. Created with the usual
  permissions (0644 under the default umask)."""
  path = str(path)
  if is_bucket(path):
    folder = tempfile.mkdtemp()
    local = os.path.join(folder, os.path.basename(path))
  else:
    folder = None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    local = os.path.join(os.path.dirname(os.path.abspath(path)),
                         temporary_name(os.path.basename(path)))
  try:
    with open(local, mode, **open_args) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())  # so that after a power loss the renamed file is not empty
    if folder is None:
      os.replace(local, path)
    else:
      epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
      epath.Path(local).copy(epath.Path(path), overwrite=True)
  finally:
    if folder is not None:
      shutil.rmtree(folder, ignore_errors=True)
    elif os.path.exists(local):
      os.remove(local)


def open_memmap(path, dtype, shape):
  """A new .npy file at local `path` memory-mapped for writing, its blocks allocated first.

  Writing into a memory map on a full disk kills the process with SIGBUS, leaving no message;
  allocating the whole file before mapping it fails instead with an ordinary OSError (ENOSPC)
  that names the file, before any byte is written.
  """
  dtype = np.dtype(dtype)
  with open(path, 'wb') as f:
    np.lib.format.write_array_header_1_0(f, {'descr': np.lib.format.dtype_to_descr(dtype),
                                             'fortran_order': False, 'shape': tuple(shape)})
    size = f.tell() + dtype.itemsize * int(np.prod(shape))
    try:
      os.posix_fallocate(f.fileno(), 0, size)
    except OSError as e:
      raise OSError(e.errno, f'{e.strerror} (allocating {size:,} bytes)', str(path)) from None
  return np.lib.format.open_memmap(path, mode='r+')


class OutOfSpace(errors.UserError, OSError):
  """A write failed because its disk or quota is full; the message says where, what is left
  and what to do."""


def out_of_space(error):
  """Whether `error`, or an error it was raised from, is a full disk or quota. Orbax
  (tensorstore) reports one as a ValueError that carries the OS message."""
  codes = (errno.ENOSPC, errno.EDQUOT)
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in codes:
      return True
    if any(os.strerror(code) in str(error) for code in codes):
      return True
    error = error.__cause__ or error.__context__
  return False


def space_left(path):
  """'X MiB free of Y MiB' on the filesystem holding the local `path` (or its nearest
  existing parent)."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  usage = shutil.disk_usage(path)
  return f'{_mib(usage.free)} free of {_mib(usage.total)}'


def _mib(size):
  return f'{size / 2**20:,.1f} MiB'


def write_atomic(path, data):
  """Writes str or bytes to `path` whole or not at all; returns the path."""
  with atomic_file(path, 'wb') as f:
    f.write(data if isinstance(data, bytes) else data.encode('utf-8'))
  return str(path)


def save_npy(path, array):
  """np.save, atomically, to a local or bucket path."""
  with atomic_file(path, 'wb') as f:
    np.save(f, array)
  return str(path)


@contextlib.contextmanager
def atomic_dir(path, *, durable=True):
  """Yields a temporary local folder (a pathlib.Path) to fill; when the block ends without
  error it is renamed to `path`, which must not exist or be an empty folder.

  durable: fsync every file first (what a cache needs: after a power loss the renamed folder
  never holds empty files); False for folders of thousands of files that a rerun can rebuild.
  Raises FileExistsError when `path` appeared, non-empty, while the folder was built (another
  process renamed its build first); the temporary is removed on every error.
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / temporary_name(path.name)
  tmp.mkdir()
  try:
    yield tmp
    if durable:
      for folder, _, names in os.walk(tmp):
        for name in names:
          fd = os.open(os.path.join(folder, name), os.O_RDONLY)
          try:
            os.fsync(fd)
          finally:
            os.close(fd)
    try:
      os.replace(tmp, path)
    except OSError as e:
      if path.is_dir() and any(path.iterdir()):
        raise FileExistsError(f'{path} was built by another process meanwhile') from e
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def remove_abandoned(folder):
  """Removes the temporaries in `folder` that processes of this host left when they died."""
  host = socket.gethostname()
  for path in pathlib.Path(folder).glob(f'{_TMP_PREFIX}*'):
    rest, _, path_host = path.name.rpartition('@')
    pid = rest.rpartition('-')[2]
    if path_host == host and pid.isdigit() and not _alive(int(pid)):
      if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
      else:
        path.unlink(missing_ok=True)


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, but another user's
    return True
  return True


def read_text(path):
  """The text of `path`, or None when it does not exist."""
  path = epath.Path(path)
  return path.read_bytes().decode('utf-8') if path.exists() else None


def join(*parts):
  return str(epath.Path(parts[0]).joinpath(*parts[1:]))


def exists(path):
  return epath.Path(path).exists()


def load_npy(path):
  with epath.Path(path).open('rb') as f:
    return np.load(f)


def prepared_dir(config, workdir):
  """Where the prepared (decoded, memory-mapped) data goes: config.data.cache_dir, else
  WORKDIR/prepared. A memory map needs a local disk, so a bucket workdir needs cache_dir."""
  if config.data.cache_dir:
    return config.data.cache_dir
  if is_bucket(workdir):
    raise errors.ConfigError(
        f"data.cache_dir='': --workdir {workdir} is a bucket, but the prepared data is "
        'memory-mapped and must be on a local disk: set --config.data.cache_dir=/local/folder')
  return str(epath.Path(workdir) / 'prepared')
