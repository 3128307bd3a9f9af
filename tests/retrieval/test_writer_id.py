"""A task added through the seams alone (docs/adding-a-task.md): closed-set writer
identification trains, resumes and evaluates through the shared CLIs."""
import json
import os

import pytest

from conftest import run_module


@pytest.mark.slow
def test_writer_identification_trains_and_scores_held_out_pages(fragment_data, tmp_path):
  workdir = tmp_path / 'writer-id'
  args = ['--config=configs/writer_id.py:test', '--data', fragment_data, '--workdir', workdir]
  run_module('launch.train', *args, '--config.train.steps=4')
  run_module('launch.train', *args)  # resumes at step 4, to the config's 6
  run_module('launch.evaluate', *args)
  scores = json.loads((workdir / 'eval' / 'metrics.json').read_text())
  assert scores['step'] == 6
  val = scores['val']
  # 6 train/ writers of 2 pages each: one page a writer held out, its fragments scored.
  assert val['num_writers'] == 6
  assert val['num_fragments'] > 0
  assert val['score'] == val['fragment_accuracy']
  assert 0 <= val['patch_accuracy'] <= 1 and 0 <= val['fragment_accuracy'] <= 1
  assert os.path.exists(workdir / 'eval' / 'report.html')


@pytest.mark.slow
def test_the_page_split_holds_out_one_page_per_writer(fragment_data, tmp_path):
  from configs import writer_id
  from retrieval.writer_id import data
  config = writer_id.get_config('test')
  config.data.dir = fragment_data
  splits = data.splits(config, str(tmp_path))
  src = splits['train'].source
  pages = {name: {(src.writer_ids[f], src.page_ids[f]) for f in s.fragments}
           for name, s in splits.items()}
  assert not pages['train'] & pages['val']
  assert sorted(w for w, _ in pages['val']) == sorted(set(src.writer_ids.tolist()))
  # Every held-out writer still trains on its other page: a closed set.
  assert {w for w, _ in pages['val']} <= {w for w, _ in pages['train']}
