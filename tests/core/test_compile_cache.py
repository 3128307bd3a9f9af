"""The persistent compilation cache (bengrapheme/compile_cache.py, launch's --compile_cache)."""
import json
import os
import subprocess
import sys

from bengrapheme import compile_cache
from conftest import ROOT

# One process: the cache on, a program compiled (cached whatever its compile time), and how
# many of its compiles jax read back from the cache.
COMPILE = '''
import json, sys, jax, jax.numpy as jnp
from jax import monitoring
from bengrapheme import compile_cache
hits = []
monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == '/jax/compilation_cache/cache_hits' else None)
folder = compile_cache.enable(sys.argv[1])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.jit(lambda x: jnp.sin(x) @ x.T + 3)(jnp.ones((8, 8))).block_until_ready()
print(json.dumps(dict(folder=folder, hits=len(hits))))
'''


def compile_in_a_process(root):
  out = subprocess.run([sys.executable, '-c', COMPILE, str(root)], cwd=ROOT,
                       check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_a_second_process_reads_the_first_ones_program(tmp_path):
  first, _ = compile_in_a_process(tmp_path)
  second, _ = compile_in_a_process(tmp_path)
  assert first == dict(folder=str(tmp_path / compile_cache.host_key()), hits=0)
  assert second['hits'] > 0
  assert any(name.endswith('-cache') for name in os.listdir(first['folder']))


def test_hosts_with_other_cpus_keep_apart(monkeypatch):
  """An executable is native code for the CPU that built it: another CPU model or feature
  set gets a folder of its own."""
  keys = set()
  for cpu in ('model name: A\nflags: avx2 fma\n', 'model name: A\nflags: avx2 avx512f fma\n',
              'model name: B\nflags: avx2 fma\n', 'model name: A\nflags: avx2 fma\n'):
    monkeypatch.setattr(compile_cache, 'cpu_description', lambda cpu=cpu: cpu)
    keys.add(compile_cache.host_key())
  assert len(keys) == 3


def test_an_unwritable_folder_leaves_the_cache_off_with_one_line(tmp_path):
  blocked = tmp_path / 'file'
  blocked.write_text('not a folder')
  result, stderr = compile_in_a_process(blocked)
  assert result == dict(folder=None, hits=0)
  (line,) = stderr.strip().splitlines()
  assert line.startswith('Warning: the compilation cache is off: ') and str(blocked) in line
  assert "--compile_cache=''" in line
