"""Scalar logs: `metrics.jsonl` for scripts and TensorBoard event files for people.

TensorBoard's own pure-Python event writer is used so that logging needs no TensorFlow.
Only process 0 writes. The workdir may be a bucket (see bengrapheme/files.py).
"""
import json
import time

import jax
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from bengrapheme import files


class MetricLogger:

  def __init__(self, workdir, subdir='train', resume_step=0):
    """Rows logged after `resume_step` by an earlier, interrupted run are dropped, so the
    curves show each step once: the steps redone after resuming replace them."""
    self.active = jax.process_index() == 0
    if self.active:
      self.path = files.join(workdir, 'metrics.jsonl')
      old = (files.read_text(self.path) or '').splitlines(keepends=True)
      # A line cut short by a crash mid-write is dropped as well.
      self.lines = [line for line in old
                    if line.endswith('\n') and json.loads(line)['step'] <= resume_step]
      self.events = EventFileWriter(files.join(workdir, 'tensorboard', subdir))
      # TensorBoard's reader discards older events at and after a restart's step (its
      # "purge"): the steps from resume_step + 1 are logged again.
      self.events.add_event(event_pb2.Event(
          wall_time=time.time(), step=int(resume_step) + 1,
          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def write(self, step, scalars):
    if not self.active:
      return
    # Curves are numbers; a score's label (the split that chose a setting) stays in
    # eval/metrics.json.
    scalars = {k: float(v) for k, v in scalars.items() if not isinstance(v, str)}
    self.lines.append(json.dumps({'step': int(step), **scalars}) + '\n')
    # Rewritten whole each time (a few hundred kB at most): buckets cannot append, and the
    # file is never left with a torn line.
    files.write_atomic(self.path, ''.join(self.lines))
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
    self.events.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                          summary=summary_pb2.Summary(value=values)))
    self.events.flush()

  def close(self):
    if self.active:
      self.events.close()
