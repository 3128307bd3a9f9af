"""The unseen-grapheme recipe: held-out sets, rendered combinations mixed into training, the
validation split of held-out graphemes, factorised consonant heads and the prediction rule."""
import collections
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bengrapheme.grapheme import classes, data, evaluate, kaggle, model, rendered, unseen
from configs import grapheme as grapheme_config


def config_for(data_dir=None, **render):
  config = grapheme_config.get_config('test')
  config.unlock()
  config.data.dir = data_dir
  config.render.update(render)
  return config


def test_held_out_sets_are_seeded_disjoint_and_never_rendered():
  config = config_for()
  config.unseen.update(never_rendered=0.5, val_graphemes=0.05)
  never, val = unseen.held_out(config)
  all_unseen = classes.unseen_triples()
  assert len(never) == round(0.5 * len(all_unseen)) and never <= set(all_unseen)
  assert len(val) == round(0.05 * len(classes.REAL_TRIPLES))
  assert val <= classes.REAL_TRIPLES
  pool = set(unseen.render_pool(config))
  assert not pool & never and not pool & val
  assert pool | never | val == classes.REAL_TRIPLES | set(all_unseen)
  # The training seed does not move them; their own seed does.
  config.seed = 7
  assert unseen.held_out(config) == (never, val)
  config.unseen.seed = 1
  assert unseen.held_out(config)[0] != never


def test_categories_follow_the_label_triple():
  config = config_for()
  config.unseen.update(never_rendered=0.5, val_graphemes=0.05)
  never, val = unseen.held_out(config)
  seen = sorted(classes.REAL_TRIPLES - val)[0]
  rendered_unseen = sorted(set(classes.unseen_triples()) - never)[0]
  # A sign root with a vowel sign is no grapheme at all: nothing renders it.
  invalid = next((r, 1, 0) for r, s in enumerate(classes.ROOTS) if s in classes.SIGN_ROOTS)
  labels = [seen, rendered_unseen, sorted(never)[0], sorted(val)[0], invalid]
  np.testing.assert_array_equal(unseen.categories(config, labels), [0, 1, 2, 2, 2])


def test_rendering_plan_is_even_over_roots_and_inside_the_pool():
  config = config_for(images=20000)
  config.unseen.update(never_rendered=0.5, val_graphemes=0.05)
  rows = rendered.plan(config)
  assert rows == rendered.plan(config)  # seeded
  pool = set(unseen.render_pool(config))
  assert all(row[:3] in pool for row in rows)
  roots = collections.Counter(row[0] for row in rows)
  assert len(roots) == kaggle.NUM_CLASSES[0]
  assert max(roots.values()) < 2 * min(roots.values())  # ~119 each, uniform
  consonants = collections.Counter(row[2] for row in rows)
  # The real table's rarest consonant classes (3: 4 graphemes, 6: 9) are common here.
  assert min(consonants[3], consonants[6]) > 0.05 * len(rows)
  for root, vowel, consonant, grapheme, text, font in rows[:50]:
    assert grapheme == classes.spelling(root, vowel, consonant) and font in rendered.synth.TRAIN_FONTS


def image_hashes(images):
  return [hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest() for image in images]


def test_kaggle_folder_and_rendered_images_share_one_stream(grapheme_data, tmp_path):
  """Real parquet images plus rendered ones, at the configured fraction of every batch; the
  stream resumes exactly from its saved state."""
  config = config_for(grapheme_data, fraction=0.25, images=24)
  workdir = str(tmp_path / 'w')
  stream = iter(data.train_data(config, workdir, local_batch=16))
  drawn = rendered.source(config, data.files.prepared_dir(config, workdir))
  rendered_hashes = set(image_hashes(drawn[i]['image'] for i in range(len(drawn))))
  real = data.source(config, workdir, 'train')
  real_hashes = set(image_hashes(real[i]['image'] for i in range(len(real))))
  for _ in range(6):
    batch = next(stream)
    hashes = image_hashes(batch['image'])
    assert sum(h in rendered_hashes for h in hashes) == 4  # 0.25 of 16, in every batch
    assert sum(h in real_hashes for h in hashes) == 12
  state = stream.get_state()
  after = [next(stream)['image'] for _ in range(3)]
  again = iter(data.train_data(config, workdir, local_batch=16))
  again.set_state(state)
  for expected in after:
    np.testing.assert_array_equal(next(again)['image'], expected)
  # The stream's class counts are recorded for the prior correction.
  counts = data.class_counts(workdir)
  assert [len(c) for c in counts] == list(classes.num_classes(config.data.corrected_labels))
  real_roots = np.bincount(real.labels[:, 0], minlength=168)
  drawn_roots = np.bincount(drawn.labels[:, 0], minlength=168)
  np.testing.assert_allclose(counts[0], 0.75 * real_roots + 0.25 * len(real) * drawn_roots / 24)


@pytest.mark.slow
def test_validation_holds_out_whole_graphemes(grapheme_data, tmp_path):
  config = config_for(grapheme_data)
  config.unseen.val_graphemes = 0.5  # the tiny fixture needs many to hold some out
  workdir = str(tmp_path / 'w')
  train, val = data.source(config, workdir, 'train'), data.source(config, workdir, 'val')
  full = data._source(config, workdir, 'train')
  assert len(train) + len(val) == len(full)
  assert not set(train.indices) & set(val.indices)
  _, val_triples = unseen.held_out(config)
  train_triples = {tuple(t) for t in train.labels.tolist()}
  val_categories = unseen.categories(config, val.labels)
  assert not train_triples & val_triples  # no image of a held-out grapheme is trained on
  assert (val_categories == 2).sum() > 0 and (val_categories == 0).sum() > 0


def test_consonant_parts_combine_into_the_seven_kaggle_classes():
  parts = np.array(classes.CONSONANT_PARTS)
  assert len({tuple(p) for p in parts}) == kaggle.NUM_CLASSES[2]  # each class its own pattern
  np.testing.assert_array_equal(parts[3], parts[2] | parts[4])  # reph + ya-phala
  np.testing.assert_array_equal(parts[6], parts[4] | parts[5])  # ra-phala + ya-phala
  # Confident part logits give the class of that pattern; outputs are log-probabilities.
  logits = jnp.asarray(np.where(parts, 6.0, -6.0), jnp.float32)
  combined = model.log_probs_from_parts(logits, classes.CONSONANT_PARTS)
  np.testing.assert_array_equal(np.argmax(combined, -1), np.arange(7))
  np.testing.assert_allclose(np.exp(combined).sum(-1), 1, rtol=1e-5)


def test_root_letters_tell_every_root_apart_and_combine_into_it():
  letters = np.array(classes.ROOT_LETTERS)
  assert letters.shape == (kaggle.NUM_CLASSES[0], len(classes.ROOT_LETTER_SLOTS))
  assert len({tuple(p) for p in letters}) == len(letters)  # no two roots share a pattern
  kssa = letters[classes.ROOTS.index('ক্ষ')]
  slots = [classes.ROOT_LETTER_SLOTS[i] for i in np.flatnonzero(kssa)]
  assert slots == [(0, 'ক'), (1, 'ষ')]
  logits = jnp.asarray(np.where(letters, 6.0, -6.0), jnp.float32)
  combined = model.log_probs_from_parts(logits, classes.ROOT_LETTERS)
  np.testing.assert_array_equal(np.argmax(combined, -1), np.arange(len(letters)))


@pytest.mark.slow
def test_test_time_views_average_the_probabilities_of_each_crop_margin():
  config = grapheme_config.get_config('test')
  config.input.update(stretch_contrast=False, crop_to_ink=True)
  images = np.full((2, kaggle.HEIGHT, kaggle.WIDTH), 255, np.uint8)
  images[:, 40:90, 60:170] = 0
  images[1, 60:70, 100:110] = 255

  def forward(x):  # logits that depend on how much of the view is ink
    ink = x.mean((1, 2, 3))[:, None]
    return {n: jnp.arange(k, dtype=jnp.float32) * ink * 10
            for n, k in zip(kaggle.COMPONENTS, kaggle.NUM_CLASSES)}

  def probs(margin):
    return np.asarray(jax.nn.softmax(forward(model.preprocess(jnp.asarray(images), config,
                                                             margin))['grapheme_root']))

  config.predict.tta_margins = ()
  one = evaluate.outputs(forward, images, config)['grapheme_root']
  # One view: training's margin.
  np.testing.assert_allclose(np.exp(one), probs(4), rtol=1e-5, atol=1e-9)
  config.predict.tta_margins = (0, 12)
  two = evaluate.outputs(forward, images, config)['grapheme_root']
  assert np.abs(probs(0) - probs(12)).max() > 1e-3  # the views differ
  np.testing.assert_allclose(np.exp(two), (probs(0) + probs(12)) / 2, rtol=1e-5, atol=1e-9)


def test_prior_correction_and_routing():
  log_p = np.log(np.array([[0.5, 0.45, 0.05]]))
  # Class 0 is 100x as common in training as class 1: tau 1 turns the close call to class 1.
  log_counts = [np.log1p([1000.0, 10.0, 10.0])] * 3
  out = {name: log_p for name in kaggle.COMPONENTS}
  plain = evaluate.decide(out, seen_threshold=evaluate.NEVER, tau=0.0, log_counts=log_counts)
  corrected = evaluate.decide(out, seen_threshold=evaluate.NEVER, tau=1.0, log_counts=log_counts)
  assert plain.tolist() == [[0, 0, 0]] and corrected.tolist() == [[1, 1, 1]]
  out.update(grapheme_prob=np.array([0.95]), grapheme_id=np.array([5]))
  routed = evaluate.decide(out, seen_threshold=0.9, tau=1.0, log_counts=log_counts)
  assert routed.tolist() == [list(classes.GRAPHEMES[5][:3])]


def test_summary_says_which_score_is_which_and_repeats_no_row():
  """The final table names the prediction rule it scores; 'unseen' is left out where it is
  one of its parts under another name (val holds no unseen rendered graphemes)."""
  config = grapheme_config.get_config('test')
  evaluator = object.__new__(evaluate.Evaluator)
  evaluator.config = config
  def block(score):
    return dict(score=score, grapheme_root=score, vowel_diacritic=score,
                consonant_diacritic=score)
  subsets = {'all': 0.8, 'seen': 0.9, 'unseen': 0.6, 'unseen_never_rendered': 0.6}
  scores = dict(combined={k: block(v) for k, v in subsets.items()},
                heads={k: block(v - 0.1) for k, v in subsets.items()}, score=0.8,
                num_images=10, num_seen=6, num_unseen=4, num_unseen_never_rendered=4)
  header, rows, note = evaluator.summary(scores)
  assert header == ('subset', 'images', 'rule', 'root', 'vowel', 'consonant', 'heads')
  assert [row[0] for row in rows] == ['all', 'seen', 'unseen_never_rendered']
  assert rows[0][2] == 0.8 and rows[0][-1] == pytest.approx(0.7)
  rule = f'prior correction tau {config.predict.tau}, routing off'
  assert rule in note and 'heads: the argmax of the component heads alone' in note
  assert evaluator.headline(scores) == (
      f'hierarchical macro recall 0.8000 with the prediction rule ({rule}); the component '
      'heads alone 0.7000')
  scores['combined']['unseen_rendered'] = scores['heads']['unseen_rendered'] = block(0.7)
  assert [row[0] for row in evaluator.summary(dict(scores, num_unseen_rendered=0))[1]] == [
      'all', 'seen', 'unseen', 'unseen_never_rendered', 'unseen_rendered']


def test_stretched_contrast_puts_any_paper_at_0_and_the_ink_at_1():
  """A grey paper under a light pen reads like white paper under black ink: the crop's ink
  threshold then finds the grapheme, not the whole frame."""
  frame = np.zeros((2, 40, 60), np.float32)
  frame[:, 10:20, 20:40] = 1.0  # the stroke
  white_black = 255 - 255 * frame
  grey_light = 185 - 110 * frame  # grey paper (185), light ink (75)
  images = np.stack([white_black[0], grey_light[0]]).astype(np.uint8)
  x = (255.0 - images.astype(np.float32)) / 255.0
  assert (x[1] > 0.25).all()  # unstretched, the grey paper itself passes the threshold
  y = np.asarray(model.stretch_contrast(jnp.asarray(x)))
  for image in y:
    assert image[12:18, 22:38].min() == pytest.approx(1.0)
    assert image[:8].max() == pytest.approx(0.0) and image[25:].max() == pytest.approx(0.0)
  config = grapheme_config.get_config('test')
  config.input.stretch_contrast = True
  cropped = np.asarray(model.preprocess(jnp.asarray(images), config))[..., 0]
  assert cropped[1].mean() < 0.9  # the crop found the stroke's box, not the whole frame
  np.testing.assert_allclose(cropped[0], cropped[1], atol=1e-5)
