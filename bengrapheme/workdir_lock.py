"""One training run owns a workdir; a second one refuses before doing any work.

Two trainers on one workdir overwrite each other's checkpoints (Orbax deletes the other's save
in flight) and logs. `acquire` is the first thing `train.train` does.

On a local or shared disk the owner holds an exclusive `fcntl.flock` on WORKDIR/lock, which
the OS drops when the process ends however it ends (SIGKILL, a crash, a lost node), so a dead
run never blocks the rerun that resumes it; the file's content only names the holder for the
refusal message. flock works across NFS clients (Linux maps it onto NFS byte-range locks),
except on a mount with `nolock`, where locks are local to one machine; Lustre without
`-o flock` refuses it, and acquire says so.

A bucket has no locks: there WORKDIR/lock.json is a lease, a holder record with an expiry
time that a heartbeat thread renews every LEASE_S / 4 seconds. A new run takes the lease only
when there is none or it expired (its holder died without removing it: a rerun waits up to
LEASE_S seconds), writes its own, waits SETTLE_S and reads it back: of two runs started
within that window the last writer keeps it and the other refuses. What this does not cover:
two runs starting more than SETTLE_S apart but each reading the bucket before the other's
write lands (seconds of bucket latency), and hosts whose clocks disagree by more than the
lease's slack. A holder that finds its lease taken (it stalled past the expiry) stops at once.

In a multi-process job process 0 holds the lock for all; the others learn its answer through
a broadcast, so a refused job ends in every process instead of waiting at a collective.
launch.evaluate and launch.predict take no lock: they only read checkpoints.
"""
import datetime
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from bengrapheme import errors, files

LEASE_S = 120.0
SETTLE_S = 3.0

_held = {}  # workdir -> its lock, for the workdirs this process owns


class Busy(errors.UserError, RuntimeError):
  """Another run holds the workdir."""


def acquire(workdir):
  """Makes this run the owner of `workdir` (a no-op if it already is); raises Busy, in every
  process of the job, when another run holds it."""
  refusal = None
  if jax.process_index() == 0 and _key(workdir) not in _held:
    lock = Lease(workdir) if files.is_bucket(workdir) else FileLock(workdir)
    try:
      lock.acquire()
      _held[_key(workdir)] = lock
    except Busy as e:
      refusal = e
  if jax.process_count() > 1:
    refused = multihost_utils.broadcast_one_to_all(np.int32(refusal is not None))
    if refused and refusal is None:
      raise Busy(f'{workdir} is in use by another run: process 0 of this job could not lock '
                 'it (its output names the holder)')
  if refusal is not None:
    raise refusal


def release(workdir):
  """Gives up `workdir` (at the end of training; a process that dies releases it anyway)."""
  lock = _held.pop(_key(workdir), None)
  if lock is not None:
    lock.release()


def _key(workdir):
  return str(workdir) if files.is_bucket(workdir) else os.path.realpath(workdir)


def holder_record():
  return dict(host=socket.gethostname(), pid=os.getpid(),
              started=datetime.datetime.now().astimezone().isoformat(timespec='seconds'),
              command=' '.join([os.path.basename(sys.executable), *sys.argv]))


def busy_message(workdir, holder, extra=''):
  if holder:
    who = (f'pid {holder.get("pid")} on host {holder.get("host")}, started '
           f'{holder.get("started")} ({holder.get("command")}){extra}')
  else:  # the holder took the lock but has not written its record yet
    who = 'a run that is just starting (it has not written its details yet)'
  return (f'{workdir} is in use by another training run: {who}. Two runs on one workdir '
          'would overwrite each other\'s checkpoints and logs. Wait for it to end or stop it '
          '(SIGTERM saves a checkpoint first), then rerun this command to resume from its '
          'newest checkpoint; or train in another --workdir. launch.evaluate and '
          'launch.predict may run meanwhile.')


class FileLock:
  """An exclusive flock on WORKDIR/lock, held until release or the process ends."""

  def __init__(self, workdir):
    self.workdir = workdir
    self.path = os.path.join(workdir, 'lock')
    self.fd = None

  def acquire(self):
    os.makedirs(self.workdir, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      try:
        holder = json.loads(os.read(fd, 1 << 16) or b'null')
      except ValueError:  # the holder is writing it right now
        holder = None
      os.close(fd)
      raise Busy(busy_message(self.workdir, holder)) from None
    except OSError as e:
      os.close(fd)
      raise OSError(e.errno, f'cannot lock {self.path} ({e.strerror}): its filesystem does not '
                    'support flock; mount it with lock support (NFS: no "nolock"; Lustre: '
                    '-o flock) so that two runs cannot write this workdir at once') from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(holder_record()).encode())
    self.fd = fd
    # The owner clears the temporaries that killed runs left (config.json, metrics.jsonl).
    files.remove_abandoned(self.workdir)
    # A forked child shares the lock: one left running by a killed parent would keep the
    # workdir locked. Children close their copy (flock ends when every copy is closed).
    os.register_at_fork(after_in_child=self._close_in_child)

  def _close_in_child(self):
    if self.fd is not None:
      os.close(self.fd)
      self.fd = None

  def release(self):
    os.close(self.fd)  # closing the last descriptor drops the flock
    self.fd = None


class Lease:
  """A lease file WORKDIR/lock.json renewed by a heartbeat thread (for bucket workdirs)."""

  def __init__(self, workdir, lease_s=LEASE_S, settle_s=SETTLE_S):
    self.workdir = workdir
    self.path = epath.Path(workdir) / 'lock.json'
    self.lease_s, self.settle_s = lease_s, settle_s
    self.record = dict(holder_record(), token=uuid.uuid4().hex)
    self.stop = threading.Event()
    self.thread = None

  def _read(self):
    text = files.read_text(self.path)
    try:
      return json.loads(text) if text else None
    except ValueError:  # a torn record cannot be one a live holder renews
      return None

  def _write(self):
    record = dict(self.record, expires=time.time() + self.lease_s)
    files.write_atomic(self.path, json.dumps(record))
    self.record = record

  def _refuse_if_held(self):
    current = self._read()
    if current and current.get('token') != self.record['token'] and (
        current.get('expires', 0) > time.time()):
      left = current['expires'] - time.time()
      raise Busy(busy_message(self.workdir, current,
                              f'; its lease on {self.path} expires in {left:.0f} s unless '
                              'renewed'))

  def acquire(self):
    self._refuse_if_held()
    self._write()
    time.sleep(self.settle_s)  # a run that started at the same moment writes meanwhile
    self._refuse_if_held()
    self.thread = threading.Thread(target=self._renew, daemon=True)
    self.thread.start()

  def _renew(self):
    while not self.stop.wait(self.lease_s / 4):
      try:
        current = self._read()
        if current is not None and current.get('token') == self.record['token']:
          self._write()
          continue
        reason = f'{self.path} now names {current and current.get("host")}, pid ' \
                 f'{current and current.get("pid")}'
      except Exception as e:  # pylint: disable=broad-except
        if time.time() < self.record['expires'] - self.lease_s / 4:
          continue  # a bucket hiccup: the lease still has time for the next try
        reason = f'renewing it failed until it nearly expired ({type(e).__name__}: {e})'
      # Another run may own the workdir now: writing on would interleave two runs'
      # checkpoints. Stopping outright is what a kill does, which the workdir survives.
      print(f'Lost the lease on {self.workdir} ({reason}); stopping this run at once.',
            file=sys.stderr, flush=True)
      os._exit(75)  # pylint: disable=protected-access

  def release(self):
    self.stop.set()
    self.thread.join()
    current = self._read()
    if current and current.get('token') == self.record['token']:
      self.path.unlink()
