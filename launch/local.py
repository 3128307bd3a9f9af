"""Runs N processes of one module on this machine as one jax.distributed job (CPU devices).

  python -m launch.local --processes 2 --devices-per-process 2 -- \
      launch.train --config configs/grapheme.py:test --data DATA --workdir DIR

Each process gets JAX_COORDINATOR_ADDRESS (127.0.0.1 and a free port), JAX_NUM_PROCESSES,
JAX_PROCESS_ID, JAX_PLATFORMS=cpu and its own simulated devices, so the multi-host code
paths of a TPU pod or a SLURM job (bengrapheme/parallel.py:initialize_distributed) run on
one machine. Output lines carry their process id. When a process fails, the others get
--grace seconds to fail on their own (as on a real cluster), then are terminated; the exit
status is 0 only when every process succeeded.
"""
import argparse
import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

DEVICE_FLAG = '--xla_force_host_platform_device_count'


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def process_env(base, index, processes, devices, port):
  flags = [f for f in base.get('XLA_FLAGS', '').split() if not f.startswith(DEVICE_FLAG)]
  return dict(base, JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
              JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index), JAX_PLATFORMS='cpu',
              XLA_FLAGS=' '.join(flags + [f'{DEVICE_FLAG}={devices}']))


def die_with_parent():
  """Runs in the child before exec: a killed launcher must not leave its processes behind."""
  ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def relay(stream, out, prefix, lock):
  """Copies `stream` to `out` line by line behind `prefix`; progress bars end lines with \\r."""
  pending = b''
  while chunk := stream.read1(65536):
    pending += chunk
    lines = pending.replace(b'\r', b'\r\n').split(b'\n')
    pending = lines.pop()
    with lock:
      for line in lines:
        if line.strip(b'\r'):
          out.write(prefix + line.rstrip(b'\r') + b'\n')
      out.flush()
  if pending:
    with lock:
      out.write(prefix + pending + b'\n')
      out.flush()


def describe(code):
  if code < 0:
    try:
      return f'was killed by {signal.Signals(-code).name}'
    except ValueError:  # a signal Python has no name for
      return f'was killed by signal {-code}'
  return f'exited with status {code}'


def run(module_args, processes, devices, grace, poll=0.1):
  """Starts the processes and waits for them; returns the launcher's exit status."""
  port = free_port()
  lock = threading.Lock()
  procs, threads = [], []
  for i in range(processes):
    procs.append(subprocess.Popen(
        [sys.executable, '-m', *module_args], env=process_env(os.environ, i, processes,
                                                              devices, port),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent))
    say(f'process {i} pid {procs[-1].pid}')
  for i, p in enumerate(procs):
    for stream, out in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
      threads.append(threading.Thread(target=relay, args=(stream, out, f'[{i}] '.encode(), lock),
                                      daemon=True))
      threads[-1].start()

  # One waiter per process, so the log orders failures by when they happened. Polling all of
  # them every `poll` s cannot tell which of two that die within one poll died first, and a
  # process killed outright often takes its peers down within milliseconds.
  ended = queue.Queue()
  for i, p in enumerate(procs):
    threading.Thread(target=lambda i=i, p=p: (p.wait(), ended.put(i)), daemon=True).start()
  failed, deadline, terminated, running = [], None, set(), set(range(processes))
  try:
    while running:
      try:
        i = ended.get(timeout=poll)
        running.remove(i)
        if procs[i].returncode != 0 and i not in terminated:
          failed.append(i)
          say(f'process {i} {describe(procs[i].returncode)}')
      except queue.Empty:
        pass
      if failed and deadline is None:
        deadline = time.monotonic() + grace
      if deadline is not None and time.monotonic() > deadline:
        terminated = stop([procs[i] for i in sorted(running)], procs)
        say(f'terminated process(es) {sorted(terminated)} {grace:g} s after a failure')
        deadline = float('inf')  # once: what is left ends within stop's wait
  except KeyboardInterrupt:
    stop(procs, procs)
    raise
  for t in threads:
    t.join()
  if failed:
    say(f'FAILED: process {failed[0]} failed first ({describe(procs[failed[0]].returncode)}); '
        f'failed: {failed}, terminated by the launcher: {sorted(terminated)}')
    return 1
  say(f'all {processes} processes succeeded')
  return 0


def stop(alive, procs, wait=10):
  """SIGTERM, then SIGKILL after `wait` s; returns the indices of the processes stopped."""
  for p in alive:
    p.terminate()
  end = time.monotonic() + wait
  for p in alive:
    try:
      p.wait(max(end - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()
  return {procs.index(p) for p in alive}


def say(message):
  print(f'[local] {message}', file=sys.stderr, flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      usage='python -m launch.local [options] -- MODULE [ARGS...]')
  parser.add_argument('--processes', type=int, default=2)
  parser.add_argument('--devices-per-process', type=int, default=1)
  parser.add_argument('--grace', type=float, default=30.0,
                      help='seconds the other processes get to exit after one fails')
  parser.add_argument('command', nargs=argparse.REMAINDER,
                      help='-- then the module to run with python -m, and its arguments')
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ['--'] else args.command
  if not command:
    parser.error('no module given: add -- MODULE [ARGS...]')
  if args.processes < 1 or args.devices_per_process < 1:
    parser.error('--processes and --devices-per-process must be at least 1')
  return run(command, args.processes, args.devices_per_process, args.grace)


if __name__ == '__main__':
  sys.exit(main())
