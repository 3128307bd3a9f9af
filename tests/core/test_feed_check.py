"""launch.train --feed_check: the input pipeline alone and the train step alone, measured and
compared, per process on a multi-process job; nothing written."""
import os
import re
import time

import pytest

from conftest import run_module

TASKS = {'grapheme': ('configs/grapheme.py:test', 'grapheme_data'),
         'fragments': ('configs/fragments.py:test', 'fragment_data')}


def rates(out):
  """{process: input examples/s} and the step's examples/s, from the check's report."""
  feeds = {int(p): float(r.replace(',', '')) for p, r in
           re.findall(r'Input \(process (\d+)\): ([\d,.]+) examples/s', out)}
  step = re.search(r'^(?:\[0\] )?Train step: ([\d,.]+) examples/s', out, re.M)
  assert feeds and step, out
  return feeds, float(step.group(1).replace(',', ''))


@pytest.mark.slow
@pytest.mark.parametrize('task', sorted(TASKS))
def test_both_rates_and_the_bound_are_reported_and_nothing_written(task, request, tmp_path):
  config, data = TASKS[task]
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  result = run_module('launch.train', f'--config={config}', '--data',
                      request.getfixturevalue(data), '--feed_check', '--feed_check_seconds=1',
                      env={'TMPDIR': str(scratch)})
  feeds, step = rates(result.stdout)
  assert list(feeds) == [0] and feeds[0] > 0 and step > 0
  bound = 'input' if feeds[0] < step else 'train step'
  assert f'Bound by the {bound}:' in result.stdout
  assert result.stdout.rstrip().endswith('Nothing written.')
  assert not os.listdir(scratch)  # the prepared data's scratch folder is gone


@pytest.mark.slow
def test_a_slow_input_is_named_as_the_bound(grapheme_data, monkeypatch, capsys):
  from configs import grapheme
  from bengrapheme.grapheme import task
  from launch import preflight
  config = grapheme.get_config('test')
  config.data.dir = grapheme_data
  fast = task.train_data

  def slow(config, workdir, local_batch):  # one batch a second: far below the step's rate
    return (time.sleep(1.0) or batch for batch in fast(config, workdir, local_batch))
  monkeypatch.setattr(task, 'train_data', slow)
  preflight.feed_check(config, seconds=2.5)
  out = capsys.readouterr().out
  feeds, step = rates(out)
  assert feeds[0] < 20 < step
  match = re.search(r'Bound by the input: the step could take ([\d.]+)x what the slowest '
                    r'process reads\. To keep the step busy each process must read ([\d,.]+) '
                    r'examples/s', out)
  assert match, out
  assert float(match.group(1)) == pytest.approx(step / feeds[0], rel=0.01)


@pytest.mark.slow
def test_each_process_reports_its_own_input(grapheme_data):
  result = run_module('launch.local', '--processes', '2', '--devices-per-process', '1', '--',
                      'launch.train', '--config=configs/grapheme.py:test', '--data',
                      grapheme_data, '--feed_check', '--feed_check_seconds=1')
  feeds, _ = rates(result.stdout + result.stderr)
  assert sorted(feeds) == [0, 1]
