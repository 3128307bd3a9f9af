"""The trainer end to end through the CLIs, on the tiny `test` config."""
import csv
import json
import os

import numpy as np
import pytest

from bengrapheme import files
from bengrapheme.grapheme import evaluate, kaggle
from conftest import run_module

CONFIG = 'configs/grapheme.py:test'


def losses(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return {r['step']: r['loss'] for r in rows if 'loss' in r}


@pytest.mark.slow
def test_eight_devices_match_one(grapheme_data, grapheme_trained, tmp_path):
  """A 4 (data) x 2 (fsdp: parameters split) mesh reproduces the 1-device losses."""
  workdir = str(tmp_path / 'eight_devices')
  run_module('launch.train', f'--config={CONFIG}', '--data', grapheme_data,
             '--workdir', workdir, '--config.train.steps=4', '--config.train.log_every=1',
             '--config.mesh.fsdp=2', devices=8)
  one, eight = losses(grapheme_trained), losses(workdir)
  assert sorted(one) == sorted(eight) == [1, 2, 3, 4]
  # Relative: the sums are ordered differently across shards, a few float32 ulps of the loss.
  np.testing.assert_allclose([eight[s] for s in range(1, 5)], [one[s] for s in range(1, 5)],
                             rtol=1e-6, atol=0)


def test_profile_trace_of_the_asked_steps(grapheme_trained):
  traces = [f for _, _, names in os.walk(os.path.join(grapheme_trained, 'profile'))
            for f in names if f.endswith('.xplane.pb')]
  assert len(traces) == 1


@pytest.mark.slow
def test_evaluate_and_predict(grapheme_data, grapheme_evaluated):
  workdir = grapheme_evaluated
  with open(os.path.join(workdir, 'eval', 'metrics.json')) as f:
    report = json.load(f)
  assert report['step'] == 4
  for split in ('val', 'test'):
    assert 0.0 <= report[split]['score'] <= 1.0
  # The synthetic test split holds both seen and unseen graphemes: both are scored.
  assert report['test']['num_unseen'] > 0 and report['test']['num_seen'] > 0
  assert 'combined/unseen/score' in report['test']
  for category in ('seen', 'unseen_rendered', 'unseen_never_rendered'):
    assert report['test'][f'num_{category}'] > 0
    assert 0 <= report['test'][f'combined/{category}/score'] <= 1
  # val (held-out graphemes) tunes the prediction rule on its grid.
  assert report['val']['tuned/tau'] in evaluate.TAUS
  assert report['val']['tuned/seen_threshold'] in evaluate.SEEN_THRESHOLDS
  assert 'tuned/tau' not in report['test']
  # test applies val's choice (eval.tune_split, one meaning for every task) as rule 'chosen'.
  assert report['val']['tuned_settings/chosen_on'] == 'val'
  assert not any(k.startswith('tuned_settings/') for k in report['test'])
  assert 0 <= report['test']['chosen/all/score'] <= 1

  run_module('launch.predict', f'--config={CONFIG}', '--data', grapheme_data,
             '--workdir', workdir)
  with open(os.path.join(grapheme_data, 'test.csv')) as f:
    expected = [row['row_id'] for row in csv.DictReader(f)]
  with open(os.path.join(workdir, 'submission.csv')) as f:
    rows = list(csv.DictReader(f))
  assert [r['row_id'] for r in rows] == expected
  limits = {'grapheme_root': 168, 'vowel_diacritic': 11, 'consonant_diacritic': 7}
  for r in rows:
    component = r['row_id'].split('_', 2)[2]
    assert 0 <= int(r['target']) < limits[component]
  # Read from the prepared copy instead of streaming the parquet files: the same answers.
  streamed = open(os.path.join(workdir, 'submission.csv')).read()
  run_module('launch.predict', f'--config={CONFIG}', '--data', grapheme_data,
             '--workdir', workdir, '--config.predict.read=prepared')
  assert open(os.path.join(workdir, 'submission.csv')).read() == streamed


@pytest.mark.slow
@pytest.mark.parametrize('window_rows', [0, 1, 4])
def test_predict_windows_read_the_test_images_in_order(grapheme_data, window_rows, tmp_path):
  """predict's windows over the test parquet files hold exactly the prepared images."""
  from bengrapheme.grapheme import prepare
  prepared = prepare.GraphemeSource(prepare.prepare(grapheme_data, 'test', tmp_path))
  windows = list(evaluate._test_windows(kaggle.validate(grapheme_data, 'test'), window_rows))
  ids = [i for window_ids, _ in windows for i in window_ids]
  assert sorted(ids) == sorted(prepared.image_ids)
  if window_rows:
    assert max(len(source) for _, source in windows) == window_rows
  row = {image_id: i for i, image_id in enumerate(prepared.image_ids)}
  for window_ids, source in windows:
    for k, image_id in enumerate(window_ids):
      np.testing.assert_array_equal(source[k]['image'], prepared[row[image_id]]['image'])


def test_submission_is_never_partial(tmp_path, monkeypatch):
  path = str(tmp_path / 'submission.csv')
  with pytest.raises(ValueError, match='3 row ids but 2 targets'):
    evaluate.write_submission(path, ['a', 'b', 'c'], [1, 2])
  assert os.listdir(tmp_path) == []
  evaluate.write_submission(path, ['a', 'b'], [1, 2])
  before = open(path).read()

  # A write that fails once the rows are written (here the flush to disk, as on a full disk)
  # leaves the previous file whole and no temporary (files.temporary_name) beside it.
  def fail(fd):
    assert sorted(os.listdir(tmp_path)) == sorted(
        ['submission.csv', files.temporary_name('submission.csv')])
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(os, 'fsync', fail)
  with pytest.raises(OSError, match='No space left'):
    evaluate.write_submission(path, ['a', 'b', 'c'], [3, 4, 5])
  assert os.listdir(tmp_path) == ['submission.csv']
  assert open(path).read() == before == 'row_id,target\na,1\nb,2\n'


@pytest.mark.slow
def test_the_chosen_rule_is_the_configured_rule_with_the_tuned_settings(grapheme_data,
                                                                         grapheme_evaluated):
  """What an evaluator applies from eval.tune_split's choice scores as a config whose own
  prediction rule holds those settings."""
  from bengrapheme import restored, evaluators
  from configs import grapheme
  config = grapheme.get_config('test')
  config.data.dir = str(grapheme_data)
  task, model = restored.trained_model(config, grapheme_evaluated)
  chosen = dict(tau=0.5, seen_threshold=0.8)
  test = evaluators.make(config, task, grapheme_evaluated, ['test'])['test']
  applied, _ = test.run(model, chosen=chosen)
  config.predict.update(chosen)
  configured = evaluators.make(config, task, grapheme_evaluated, ['test'])['test']
  assert applied['chosen'] == configured.run(model)[0]['combined']
