"""XLA's persistent compilation cache, one folder per host kind.

A restart, a resume after preemption, `launch.evaluate` after training and every test process
compile the same programs again: tracing is cheap next to XLA's compile of a large step
(experiments/compile_time.py), which the cache replaces by reading the executable back. maxtext
turns it on the same way (its jax_cache_dir).

The folder is named for this host's platform and CPU: a CPU executable is native code for
the CPU that built it, and XLA runs one built for another CPU model after only a log line
(as a home folder shared by a cluster's nodes would offer it). Accelerator programs are
keyed by their device kind within jax's own key.
"""
import hashlib
import os
import platform
import sys

# A bound on the folder also turns on jax's file lock around each read and write, so that
# processes of one job (or tests) sharing the folder never read an entry half written.
MAX_BYTES = 4 * 2**30


def cpu_description():
  """The CPU's model and feature flags as /proc/cpuinfo lists them (what its code may use),
  or, elsewhere than Linux, the processor's name."""
  try:
    with open('/proc/cpuinfo') as f:
      return ''.join(sorted({l for l in f
                             if l.startswith(('model name', 'flags', 'Features', 'CPU part'))}))
  except OSError:
    return platform.processor()


def host_key():
  """'x86_64-' and a digest of cpu_description()."""
  digest = hashlib.sha256(cpu_description().encode()).hexdigest()[:12]
  return f'{platform.machine()}-{digest}'


def enable(root):
  """Caches compiled programs under ROOT/host_key() (root '' leaves the cache off); a folder
  that cannot be made leaves it off with one line on stderr, as a cache is no reason to
  stop a run. Returns the folder, or None."""
  if not root:
    return None
  path = os.path.join(os.path.expanduser(root), host_key())
  try:
    os.makedirs(path, exist_ok=True)
    if not os.access(path, os.W_OK | os.X_OK):
      raise PermissionError('not writable by this user')
  except OSError as e:
    print(f'Warning: the compilation cache is off: {path}: {e.strerror or e} '
          "(--compile_cache=FOLDER to put it elsewhere, --compile_cache='' to silence this)",
          file=sys.stderr, flush=True)
    return None
  # Through the environment where jax is not imported yet: importing it here would start it
  # before launch.train's --dry_run_devices sets the simulated device count. Child
  # processes (launch commands of launch commands) inherit the same folder.
  os.environ['JAX_COMPILATION_CACHE_DIR'] = path
  os.environ['JAX_COMPILATION_CACHE_MAX_SIZE'] = str(MAX_BYTES)
  if 'jax' in sys.modules:
    jax = sys.modules['jax']
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_compilation_cache_max_size', MAX_BYTES)
  return path
