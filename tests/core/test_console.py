"""What a person sees while a job runs (bengrapheme/console.py): plain progress lines when the
output is not a terminal, an ETA from steady-state steps only, and the closing score table."""
import pytest

from bengrapheme import console


class Clock:
  """A stand-in for time.perf_counter that moves only when told."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock(monkeypatch):
  clock = Clock()
  monkeypatch.setattr(console.time, 'perf_counter', clock)
  monkeypatch.setattr(console, 'on_terminal', lambda: False)  # as in a SLURM log
  return clock


def test_progress_prints_a_plain_line_every_interval_and_one_at_the_end(clock, capsys):
  with console.Progress(100, 'extracting patches', unit='fragment') as progress:
    for _ in range(100):
      clock.now += 1.0  # 1 fragment/s: a line every 30 s
      progress.update()
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 4 and '\r' not in ''.join(lines)
  assert lines[0].endswith('extracting patches: 30/100 fragments (30 %), 1.0/s, ETA 0:01:10')
  assert lines[-1].endswith('extracting patches: 100 fragments in 0:01:40')


def test_progress_without_a_name_is_silent(clock, capsys):
  with console.Progress(10, None) as progress:
    for _ in range(10):
      clock.now += 60
      progress.update()
  assert capsys.readouterr().out == ''


def test_training_eta_leaves_out_compilation_and_evaluations(clock, capsys):
  progress = console.TrainingProgress(total_steps=1000, start_step=0, batch_size=100)
  clock.now += 300.0  # step 1 compiles: five minutes
  progress.update(1)
  progress.start_steady()
  for step in range(2, 102):  # then 2 steps a second
    clock.now += 0.5
    progress.update(step, loss=2.0 if step == 100 else None)
  with progress.paused():  # an evaluation during training
    clock.now += 600.0
  clock.now += 0.5
  progress.update(102)
  # 101 steady steps in 50.5 s of training: 2 steps/s, 200 images/s, 898 steps to go.
  assert progress.status() == 'loss 2.000, 200 images/s, ETA 0:07:29'
  lines = capsys.readouterr().out.splitlines()
  assert [line.split('] ')[1] for line in lines] == [
      'step 61/1,000 (6 %) 200 images/s, ETA 0:07:50',
      'step 102/1,000 (10 %) loss 2.000, 200 images/s, ETA 0:07:29']


def test_text_table_aligns_numbers():
  table = console.text_table(('method', 'writer mAP'), [('encoder', 0.4751), ('fused', 0.5)])
  assert table.splitlines() == ['method   writer mAP', '-------  ----------',
                                'encoder       0.475', 'fused         0.500']
