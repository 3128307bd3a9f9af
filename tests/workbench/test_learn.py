"""Training with the workbench's decisions: the classes they make beside
the surrogate ones, the batches that hold a rejected pair together, the snapshot a resumed
run reads, and the config check."""
import os

import numpy as np
import pytest

from bengrapheme import errors
from retrieval.fragments import data
from retrieval.collections import decisions as db_lib, learn

from test_decisions import decision

PATHS = ['a.png', 'b.png', 'c.png', 'd.png', 'e.png', 'f.png']


@pytest.fixture
def decided(tmp_path):
  store = db_lib.Decisions(str(tmp_path / 'decisions.sqlite'))
  store.add(decision('a.png', 'b.png', 'same'))
  store.add(decision('b.png', 'c.png', 'same'))
  store.add(decision('a.png', 'd.png', 'different'))
  store.add(decision('e.png', 'f.png', 'unsure'))
  store.add(decision('e.png', 'gone.png', 'same'))  # not among the training images
  undone = store.add(decision('d.png', 'e.png', 'same'))
  store.undo(undone.id)
  return store.path


def base_labels():
  """Fragment f has patches 4f .. 4f + 3, two patches a surrogate class (0-9)."""
  fragment_of = np.repeat(np.arange(len(PATHS)), 4)
  return fragment_of, np.arange(len(fragment_of)) // 2 % 10


def test_accepted_groups_and_rejected_fragments_become_classes(decided):
  fragment_of, base = base_labels()
  labels, classes, partners = learn.classes(decided, PATHS, fragment_of, base)
  group, rejected = 10, 11  # numbered after the surrogate classes
  assert labels.tolist() == [group] * 12 + [rejected] * 4 + base[16:].tolist()
  assert classes == [group, rejected]
  assert partners == {group: [rejected], rejected: [group]}


def test_a_batch_holds_decided_classes_with_their_rejected_partner():
  # Surrogate classes 0-9 (2 patches each), decided classes 10-12; 10 was rejected against 12.
  labels = np.concatenate([np.repeat(np.arange(10), 2), np.repeat([10, 11, 12], 3)])
  sampler = learn.DecisionBatches(labels, [10, 11, 12], {10: [12], 12: [10]},
                                  classes_per_batch=4, per_class=2, seed=0)
  seen = set()
  for b in range(40):
    batch = sampler[b]
    assert len(batch) == 8 and (sampler[b] == batch).all()  # a pure function of b
    drawn = [int(labels[batch[i]]) for i in range(0, 8, 2)]
    assert all(labels[batch[i]] == labels[batch[i + 1]] for i in range(0, 8, 2))
    assert len(set(drawn)) == 4 and len(set(drawn) & {10, 11, 12}) >= 2, drawn
    assert (10 in drawn) == (12 in drawn), drawn  # a rejected pair meets in its batch
    seen |= set(drawn)
  assert seen == set(range(13))


def test_a_resumed_run_reads_the_classes_it_started_with(decided, tmp_path):
  fragment_of, base = base_labels()
  first = learn.snapshot(str(tmp_path), decided, PATHS, fragment_of, base)
  db_lib.Decisions(decided).add(decision('d.png', 'f.png', 'same'))  # decided since
  again = learn.snapshot(str(tmp_path), decided, PATHS, fragment_of, base)
  assert again[0].tolist() == first[0].tolist() and again[1:] == first[1:]


def test_decisions_need_a_collection_trained_with_surrogate_classes(tmp_path):
  import configs.fragments as fragments
  config = fragments.get_config('demo')
  config.data.decisions = str(tmp_path / 'd.sqlite')
  with pytest.raises(errors.ConfigError, match='data=collection'):
    data.check_data(config)
  with pytest.raises(errors.UserError, match='no such file'):
    learn.classes(str(tmp_path / 'nothing.sqlite'), PATHS, *base_labels())


@pytest.mark.slow
def test_a_collection_trains_with_the_decisions_beside_its_surrogate_classes(fragment_data,
                                                                           tmp_path):
  from conftest import run_module
  folder = os.path.join(fragment_data, 'test')
  names = sorted(os.listdir(folder))
  by_writer = {}
  for name in names:
    by_writer.setdefault(name.split('_')[0], []).append(name)
  (a, b, c), other = by_writer[min(by_writer)][:3], by_writer[max(by_writer)][0]
  db = str(tmp_path / 'decisions.sqlite')
  store = db_lib.Decisions(db)
  store.add(decision(a, b, 'same'))
  store.add(decision(b, c, 'same'))
  store.add(decision(a, other, 'different'))
  workdir = tmp_path / 'mine'
  run_module('launch.train', '--config=configs/fragments.py:size=test,data=collection',
             '--config.train.surrogate_classes=8', f'--config.data.decisions={db}',
             '--data', folder, '--workdir', workdir)
  with np.load(workdir / learn.SNAPSHOT) as z:
    labels, classes = z['labels'], z['decided'].tolist()
  assert classes == [8, 9]  # the group a-b-c, and the fragment rejected against it
  assert (labels < 8).any() and set(np.unique(labels[labels >= 8])) == {8, 9}
