"""Scalar logs: `metrics.jsonl` for scripts and TensorBoard event files for people.

TensorBoard's own pure-Python event writer is used so that logging needs no TensorFlow.
Only process 0 writes.
"""
import json
import os
import time

import jax
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class MetricLogger:

  def __init__(self, workdir, subdir='train'):
    self.active = jax.process_index() == 0
    if self.active:
      os.makedirs(workdir, exist_ok=True)
      self.jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a')
      self.events = EventFileWriter(os.path.join(workdir, 'tensorboard', subdir))

  def write(self, step, scalars):
    if not self.active:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    self.jsonl.write(json.dumps({'step': int(step), **scalars}) + '\n')
    self.jsonl.flush()
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
    self.events.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                          summary=summary_pb2.Summary(value=values)))
    self.events.flush()

  def close(self):
    if self.active:
      self.jsonl.close()
      self.events.close()
