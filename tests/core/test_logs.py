"""Scalar logs: event files that TensorBoard's own reader parses, and metrics.jsonl beside them."""
import json
import os
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from bengrapheme import logs
from conftest import run_module


def tensorboard_scalars(logdir):
  """{tag: [(step, value)]} as TensorBoard shows them (restarts purged)."""
  accumulator = event_accumulator.EventAccumulator(str(logdir))
  accumulator.Reload()
  return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
          for tag in accumulator.Tags()['scalars']}


def jsonl(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_scalars_read_back(tmp_path):
  logger = logs.MetricLogger(str(tmp_path))
  for step in (1, 2, 3):
    logger.write(step, {'loss': 1 / step, 'lr': 1e-3 * step, 'images_per_s': 100 + step})
  logger.write(3, {'val/score': 0.25})
  logger.close()
  got = tensorboard_scalars(tmp_path / 'tensorboard' / 'train')
  assert sorted(got) == ['images_per_s', 'loss', 'lr', 'val/score']
  # Event files hold float32.
  assert got['loss'] == [(s, np.float32(1 / s)) for s in (1, 2, 3)]
  assert got['lr'] == [(s, np.float32(1e-3 * s)) for s in (1, 2, 3)]
  assert got['images_per_s'] == [(s, 100 + s) for s in (1, 2, 3)]
  assert got['val/score'] == [(3, 0.25)]
  assert jsonl(tmp_path)[-1] == {'step': 3, 'val/score': 0.25}


def test_resume_replaces_the_steps_after_the_checkpoint(tmp_path):
  """A run logged steps 1..6 and died; its newest checkpoint was step 4. The resumed run
  logs 5..8 again: each step must show once, steps <= 4 from the first run."""
  first = logs.MetricLogger(str(tmp_path))
  for step in range(1, 7):
    first.write(step, {'loss': step})
  first.close()
  time.sleep(1.1)  # a restart is a later event file: its name starts with the second
  resumed = logs.MetricLogger(str(tmp_path), resume_step=4)
  for step in range(5, 9):
    resumed.write(step, {'loss': 10 * step})
  resumed.close()
  expected = [(1, 1), (2, 2), (3, 3), (4, 4), (5, 50), (6, 60), (7, 70), (8, 80)]
  assert len(os.listdir(tmp_path / 'tensorboard' / 'train')) == 2
  assert tensorboard_scalars(tmp_path / 'tensorboard' / 'train')['loss'] == expected
  assert [(row['step'], row['loss']) for row in jsonl(tmp_path)] == expected


@pytest.mark.slow
def test_training_run_logs_loss_lr_throughput_and_evals(grapheme_data, grapheme_trained,
                                                        tmp_path):
  workdir = str(tmp_path / 'run')
  result = run_module(
      'launch.train', '--config=configs/grapheme.py:test', '--data', grapheme_data,
      '--workdir', workdir, '--config.train.steps=4', '--config.train.log_every=2',
      '--config.train.checkpoint_every=4',
      '--config.evals.val.every=4')  # val only: test would be converted too
  # Each logged value is the mean over the steps since the previous line, not the value of
  # the step the line falls on: grapheme_trained is the same run logged at every step.
  every_step = {row['step']: row for row in jsonl(grapheme_trained) if 'loss' in row}
  for row in (row for row in jsonl(workdir) if 'loss' in row):
    steps = [row['step'] - 1, row['step']]
    for key in ('loss', 'grad_norm', 'lr'):
      assert row[key] == pytest.approx(np.mean([every_step[s][key] for s in steps]),
                                       rel=1e-4), key
    assert row['loss_max'] == pytest.approx(max(every_step[s]['loss'] for s in steps),
                                            rel=1e-4)
  # A line for each phase; plain progress lines, not a bar's '\r' updates (not a terminal).
  for phase in ('Initialising the model', 'Compiling the train step',
                'Compiled and ran step 1', 'step 4/4 (100 %)', "Evaluating val at step 4"):
    assert phase in result.stdout, phase
  assert '\r' not in result.stdout + result.stderr
  got = tensorboard_scalars(os.path.join(workdir, 'tensorboard', 'train'))
  for tag in ('loss', 'lr', 'images_per_s', 'grad_norm'):
    assert [step for step, _ in got[tag]] == [2, 4], tag
    assert all(np.isfinite(value) for _, value in got[tag])
  assert all(value > 0 for _, value in got['images_per_s'])
  assert [step for step, _ in got['val/score']] == [4]
  assert 0 <= got['val/score'][0][1] <= 1
  # The same numbers as metrics.jsonl, rounded to float32.
  loss = {row['step']: row['loss'] for row in jsonl(workdir) if 'loss' in row}
  assert got['loss'] == [(step, np.float32(loss[step])) for step in (2, 4)]
