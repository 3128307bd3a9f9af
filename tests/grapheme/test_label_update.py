"""The March 2020 label update: class_map_corrected.csv and train_multi_diacritics.csv.

Kaggle added consonant class 7 (reph + ra-phala) and relabelled the train rows of the three
graphemes that carry both. config.data.corrected_labels trains on the 8 classes; scores and
submission.csv stay in the competition's 7 (7 counts as 2).
"""
import csv
import json
import os

import jax
import numpy as np
import pytest

from bengrapheme.grapheme import classes, data, evaluate, kaggle, synth
from bengrapheme.grapheme.kaggle import DataError
from conftest import run_module
from configs import grapheme as grapheme_config


def test_class_seven_is_reph_with_ra_phala():
  assert classes.MULTI_DIACRITIC_GRAPHEMES == ('র্ত্রী', 'র্ত্রে', 'র্দ্র')
  assert len(classes.CORRECTED_CONSONANTS) == 8 and classes.num_classes(True) == (168, 11, 8)
  names = classes.CONSONANT_PART_NAMES
  parts = dict(zip(names, classes.CORRECTED_CONSONANT_PARTS[classes.REPH_RA_PHALA]))
  assert parts == dict(candrabindu=0, reph=1, ya_phala=0, ra_phala=1)
  # The other 7 patterns are the competition's, so 7 is a new pattern, not a duplicate.
  assert classes.CORRECTED_CONSONANT_PARTS[:7] == classes.CONSONANT_PARTS
  assert len(set(classes.CORRECTED_CONSONANT_PARTS)) == 8
  labels = np.array([[64, 3, 7], [72, 0, 2], [10, 1, 5]])
  np.testing.assert_array_equal(classes.to_competition(labels), [[64, 3, 2], [72, 0, 2],
                                                                  [10, 1, 5]])


def write_tables(tmp_path):
  """The synthetic generator's CSV files for a train split holding two of the graphemes."""
  rows = []
  for i, (r, v, c, g) in enumerate(classes.GRAPHEMES[:6]):
    rows.append((f'Train_{i}', r, v, c, g, g, 'font', True))
  for i, g in enumerate(classes.MULTI_DIACRITIC_GRAPHEMES[:2], start=6):
    r, v, c, _ = classes.GRAPHEMES[classes.grapheme_id(g)]
    rows.append((f'Train_{i}', r, v, c, g, g, 'font', True))
  synth.write_tables(str(tmp_path), rows, [])
  return [row[0] for row in rows]


def test_synthetic_generator_writes_the_update(tmp_path):
  image_ids = write_tables(tmp_path)
  corrected = kaggle.corrected_labels(tmp_path, image_ids)
  assert sorted(corrected) == [6, 7]
  for row in (6, 7):
    assert corrected[row][2] == classes.REPH_RA_PHALA
  with open(tmp_path / kaggle.CLASS_MAP_CORRECTED, encoding='utf-8') as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == len(classes.class_map()) + 1
  assert rows[-1]['component_type'] == 'consonant_diacritic' and rows[-1]['label'] == '7'


@pytest.mark.parametrize('name,edit,expected', [
    (kaggle.MULTI_DIACRITICS, lambda t: t.replace(',7,', ',8,', 1),
     ['line 2', 'consonant_diacritic 8 is out of range', '[0, 8)']),
    (kaggle.MULTI_DIACRITICS, lambda t: t.replace('Train_6', 'Train_99', 1),
     ["image_id 'Train_99' is not in train.csv"]),
    (kaggle.MULTI_DIACRITICS, lambda t: t.replace('consonant_diacritic', 'consonant', 1),
     ["header has no column 'consonant_diacritic'"]),
    (kaggle.MULTI_DIACRITICS, lambda t: t + t.splitlines()[1] + '\n',
     ["duplicate image_id 'Train_6'"]),
    (kaggle.CLASS_MAP_CORRECTED, lambda t: t.rsplit('consonant_diacritic,7', 1)[0],
     ['consonant_diacritic has labels [0, 1, 2, 3, 4, 5, 6]; expected 0..7']),
    (kaggle.CLASS_MAP_CORRECTED, lambda t: t.replace('grapheme_root,0,', 'root,0,', 1),
     ["line 2: component_type 'root'"]),
    (kaggle.CLASS_MAP_CORRECTED, None, ['file is missing', 'corrected_labels=False']),
])
def test_malformed_update_files_are_named(tmp_path, name, edit, expected):
  image_ids = write_tables(tmp_path)
  path = tmp_path / name
  if edit is None:
    path.unlink()
  else:
    path.write_text(edit(path.read_text(encoding='utf-8')), encoding='utf-8')
  with pytest.raises(DataError) as e:
    kaggle.corrected_labels(tmp_path, image_ids)
  assert str(path) in str(e.value)
  for part in expected:
    assert part in str(e.value)


def test_header_only_update_changes_nothing(tmp_path):
  image_ids = write_tables(tmp_path)
  path = tmp_path / kaggle.MULTI_DIACRITICS
  path.write_text(path.read_text(encoding='utf-8').splitlines()[0] + '\n', encoding='utf-8')
  assert kaggle.corrected_labels(tmp_path, image_ids) == {}


@pytest.mark.slow
def test_kaggle_folder_end_to_end(grapheme_data, tmp_path):
  """A folder as Kaggle ships it (no test answers) with 4 train rows relabelled 7: training
  reads the 8 classes (its class counts have a class 7); evaluate scores val, says in one
  line that it skipped test and why, and writes metrics.json and the report; prediction
  writes the 7 Kaggle classes."""
  folder = tmp_path / 'data'
  folder.mkdir()
  for name in os.listdir(grapheme_data):
    if name not in (kaggle.MULTI_DIACRITICS, kaggle.TEST_LABELS):
      os.symlink(os.path.join(grapheme_data, name), folder / name)
  with open(os.path.join(grapheme_data, 'train.csv'), encoding='utf-8') as f:
    train = list(csv.DictReader(f))[:4]
  with open(folder / kaggle.MULTI_DIACRITICS, 'w', encoding='utf-8') as f:
    f.write(','.join(kaggle.LABEL_COLUMNS) + '\n')
    for row in train:
      f.write(f"{row['image_id']},{row['grapheme_root']},{row['vowel_diacritic']},7,"
              f"{row['grapheme']}\n")
  config = grapheme_config.get_config('test')
  config.unlock()
  config.data.dir = str(folder)
  config.data.cache_dir = str(tmp_path / 'cache')
  full = data._source(config, str(tmp_path), 'train')
  relabelled = {row['image_id'] for row in train}
  for i in range(len(full)):
    assert (full.labels[i][2] == 7) == (full.source.image_ids[i] in relabelled)
    assert full[i]['labels'][2] == full.labels[i][2]

  workdir = tmp_path / 'workdir'
  args = ['--config=configs/grapheme.py:test', '--data', folder, '--workdir', workdir,
          f'--config.data.cache_dir={tmp_path / "cache"}']
  run_module('launch.train', *args, '--config.train.steps=2')
  counts = json.loads((workdir / data.CLASS_COUNTS).read_text())['consonant_diacritic']
  assert len(counts) == 8 and counts[7] > 0

  result = run_module('launch.evaluate', *args)
  skip_lines = [line for line in result.stdout.splitlines() if 'Skipping split' in line]
  assert len(skip_lines) == 1 and "split 'test' has no labels" in skip_lines[0]
  report = json.loads((workdir / 'eval' / 'metrics.json').read_text())
  assert 0 <= report['val']['score'] <= 1 and 'test' not in report
  assert "split 'test' has no labels" in report['skipped']['test']
  table = result.stdout[result.stdout.index('\nval (step 2):\n'):].splitlines()
  assert table[2].split() == ['subset', 'images', 'rule', 'root', 'vowel', 'consonant',
                              'heads']
  assert float(table[4].split()[2]) == pytest.approx(report['val']['score'], abs=5e-4)
  assert (workdir / 'eval' / 'report.html').stat().st_size > 0

  run_module('launch.predict', *args)
  with open(workdir / 'submission.csv') as f:
    targets = [int(r['target']) for r in csv.DictReader(f)
               if r['row_id'].endswith('consonant_diacritic')]
  assert targets and max(targets) < 7


def test_scores_map_class_seven_to_two():
  """A model's class-7 prediction scores as the competition's class 2."""
  log_probs = np.full((2, 8), -10.0, np.float32)
  log_probs[:, 7] = 0.0
  out = {'grapheme_root': np.zeros((2, 168), np.float32),
         'vowel_diacritic': np.zeros((2, 11), np.float32), 'consonant_diacritic': log_probs}
  decided = evaluate.decide(out, seen_threshold=evaluate.NEVER, tau=0.0,
                            log_counts=[np.zeros(n) for n in classes.num_classes(True)])
  assert np.asarray(decided)[:, 2].tolist() == [7, 7]
  assert classes.to_competition(jax.device_get(decided))[:, 2].tolist() == [2, 2]
