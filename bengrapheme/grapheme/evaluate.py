"""The grapheme evaluator (hierarchical macro recall, seen vs unseen graphemes) and the Kaggle
submission, both fed by the one eval loop (bengrapheme/inference.py)."""
import jax
import jax.numpy as jnp
import numpy as np

from bengrapheme import console, inference, files
from bengrapheme.grapheme import classes, data, kaggle, metrics, report, unseen
from bengrapheme.grapheme.model import CROP_MARGIN, preprocess

# Triple of each whole-grapheme class, to turn a whole-grapheme prediction into components.
GRAPHEME_TRIPLES = np.array([g[:3] for g in classes.GRAPHEMES], np.int32)
# The grid the validation split tunes the prediction rule over (Evaluator, split 'val').
TAUS = (0.0, 0.25, 0.5, 0.75, 1.0)
NEVER = 2.0  # a seen threshold no probability reaches: the component heads always decide
SEEN_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99, NEVER)


def outputs(forward, images, config):
  """What the prediction rules read per image: each component's log-probabilities and, with a
  whole-grapheme head, its top probability and class.

  With config.predict.tta_margins, the probabilities are averaged over one view of the image
  per crop margin (crop_to_ink): the ink box's scale in the frame is what varies most between
  writers and scanners once the crop has removed position.
  """
  views = [forward(preprocess(images, config, margin))
           for margin in config.predict.tta_margins or (CROP_MARGIN,)]
  out = {n: jax.nn.logsumexp(jnp.stack([jax.nn.log_softmax(v[n], -1) for v in views]), 0)
         - np.log(len(views)) for n in kaggle.COMPONENTS}
  if 'grapheme' in views[0]:
    probs = jnp.mean(jnp.stack([jax.nn.softmax(v['grapheme'], -1) for v in views]), 0)
    out.update(grapheme_prob=jnp.max(probs, -1), grapheme_id=jnp.argmax(probs, -1))
  return out


def decide(out, *, seen_threshold, tau, log_counts):
  """Component labels [B, 3] from `outputs`, on device or on host.

  Prior correction (10th/13th/14th places): each component takes the argmax of
  log p - tau * log(training count), which favours rare classes as macro recall rewards.
  Routing (1st place): where the whole-grapheme head is at least `seen_threshold` sure the
  image is one of the 1,295 known graphemes, that grapheme's components are used instead.
  """
  components = jnp.stack([jnp.argmax(out[n] - tau * jnp.asarray(c, jnp.float32), -1)
                          for n, c in zip(kaggle.COMPONENTS, log_counts)], -1)
  if 'grapheme_prob' not in out:
    return components
  seen = out['grapheme_prob'] >= seen_threshold
  return jnp.where(seen[:, None], jnp.asarray(GRAPHEME_TRIPLES)[out['grapheme_id']], components)


def _to_competition(labels):
  """classes.to_competition of labels [B, 3] on the device."""
  consonant = labels[:, 2]
  return labels.at[:, 2].set(jnp.where(consonant == classes.REPH_RA_PHALA, 2, consonant))


def log_counts(config, workdir, needed):
  """log(1 + training count) per class of each component; zeros when not `needed` (tau 0 and
  no tuning), so a workdir without class_counts.json still evaluates."""
  if not needed:
    return [np.zeros(n) for n in classes.num_classes(config.data.corrected_labels)]
  return [np.log1p(c) for c in data.class_counts(workdir)]


class Evaluator:
  """Hierarchical macro recall on one split, over all images and per category (unseen.py).

  Scores {rule: {subset: {score, grapheme_root, vowel_diacritic, consonant_diacritic}}} for
  the rules 'heads' (argmax of the component heads), 'combined' (config.predict's rule:
  prior correction and, with a whole-grapheme head, routing; what predictions use) and, when
  eval.tune_split's evaluator chose settings, 'chosen' (that choice applied), over the
  subsets all, seen, unseen and its two parts unseen_rendered / unseen_never_rendered; a
  subset with no image is left out. 'score' is 'combined' over all images. As the tuning
  evaluator (tune=True), 'tuned' holds the rule's best settings on the grid TAUS x
  SEEN_THRESHOLDS by the mean score over the categories present (the split's mix of seen and
  unseen does not decide) and that mean for the configured rule; 'tuned_settings' the
  choice the others apply.
  Every score comes from confusion matrices counted in the eval step per rule and category
  (metrics.confusion_on_device) and summed on the devices, across processes too.
  Details, for the report: per image in row order, `labels`, `predictions` of 'combined' and
  `category` (an index into unseen.CATEGORIES).
  """

  def __init__(self, config, split, workdir):
    self.config, self.split, self.workdir = config, split, workdir
    self.source = data.source(config, workdir, split)
    # Kaggle's test split has no labels (-1 everywhere).
    if not (self.source.labels >= 0).all():
      raise inference.Unlabelled(
          f"split {split!r} has no labels to score (Kaggle's test.csv has none; the synthetic "
          'data writes test_labels.csv)')

  def run(self, model, chosen=None, tune=False):
    config = self.config
    counts = log_counts(config, self.workdir, bool(config.predict.tau or tune or chosen))
    # The rules counted, as (tau, seen_threshold); the tuning evaluator counts its whole grid
    # in the same pass.
    rules = {'heads': (0.0, NEVER),
             'combined': (config.predict.tau, config.predict.seen_threshold)}
    if chosen:
      rules['chosen'] = (chosen['tau'], chosen['seen_threshold'])
    if tune:
      # Without a whole-grapheme head the threshold changes nothing (decide): not a setting.
      thresholds = SEEN_THRESHOLDS if config.model.get('grapheme_head') else (NEVER,)
      grid = [(tau, t) for tau in TAUS for t in thresholds]
      rules.update({s: s for s in grid})
    index = {rule: i for i, rule in enumerate(rules)}
    settings = np.array(list(rules.values()), np.float32)  # [rules, (tau, seen_threshold)]
    # The category of every triple, looked up on the device.
    triples = np.indices(kaggle.NUM_CLASSES).reshape(3, -1).T
    category_of = unseen.categories(config, triples).reshape(kaggle.NUM_CLASSES)
    # Confusion matrices per rule and category of a batch: rules x categories x 3 components.
    count = jax.vmap(jax.vmap(metrics.confusion_on_device, (None, None, 0)), (None, 0, None))

    def predict(forward, batch):
      out = outputs(forward, batch['image'], config)
      # Scored in the competition's classes, whichever the model learnt (corrected_labels).
      labels = _to_competition(batch['labels'])
      category = jnp.asarray(category_of)[labels[:, 0], labels[:, 1], labels[:, 2]]
      # Every rule from one vmapped decide: a loop over the 37 rules of a tuning run compiled
      # ~1-2 s longer on 2 cores.
      predicted = jax.vmap(lambda s: _to_competition(
          decide(out, tau=s[0], seen_threshold=s[1], log_counts=counts)))(settings)
      masks = (category == jnp.arange(len(unseen.CATEGORIES))[:, None]) & batch['mask']
      rows = dict(labels=labels, predictions=predicted[index['combined']], category=category)
      return rows, count(labels, predicted, masks)

    sums = [np.zeros((len(rules), len(unseen.CATEGORIES), c, c), np.int32)
            for c in kaggle.NUM_CLASSES]
    details, confusion = inference.outputs_by_row(
        model, predict, self.source, batch_size=config.eval.batch_size,
        keys=('image', 'labels'), what=f'predicting {len(self.source):,} {self.split} images',
        sums=sums)
    # A subset is a union of categories, and its matrices the sum of theirs.
    size = confusion[0][0].sum(axis=(1, 2))  # images per category
    subsets = {'all': [0, 1, 2], 'seen': [0], 'unseen': [1, 2], 'unseen_rendered': [1],
               'unseen_never_rendered': [2]}
    images = {name: int(size[among].sum()) for name, among in subsets.items()}

    def score(rule, among):
      return metrics.from_confusion([m[index[rule], among].sum(0) for m in confusion])

    extra = {}
    if tune:
      present = [[k] for k in range(len(unseen.CATEGORIES)) if size[k]]

      def balanced(rule):
        return float(np.mean([score(rule, among)['score'] for among in present]))

      (tau, threshold), best = max(((s, balanced(s)) for s in grid), key=lambda kv: kv[1])
      extra['tuned'] = dict(tau=tau, seen_threshold=threshold, balanced_score=best,
                            configured_balanced_score=balanced('combined'))
      index['chosen'] = index[tau, threshold]
      extra['tuned_settings'] = dict(tau=tau, seen_threshold=threshold,
                                     chosen_on=config.eval.tune_split)
    scores = {rule: {name: score(rule, among) for name, among in subsets.items()
                     if images[name]}
              for rule in ('heads', 'combined', 'chosen') if rule in index}
    scores.update(extra, score=scores['combined']['all']['score'], num_images=images['all'],
                  **{f'num_{name}': n for name, n in images.items() if name != 'all'})
    return scores, details

  def rule(self):
    """The configured prediction rule in words."""
    p = self.config.predict
    routing = ('off' if p.seen_threshold >= 1 or not self.config.model.get('grapheme_head')
               else f'where the whole-grapheme head is >= {p.seen_threshold} sure')
    return f'prior correction tau {p.tau}, routing {routing}'

  def headline(self, scores):
    return (f"hierarchical macro recall {scores['score']:.4f} with the prediction rule "
            f"({self.rule()}); the component heads alone {scores['heads']['all']['score']:.4f}")

  def summary(self, scores):
    """(header, rows, note) of the headline scores, for the console: each subset's score
    under the prediction rule, its components, and the component heads alone. 'unseen' is
    left out when only one of its two parts is present (it would repeat that row)."""
    parts = [n for n in ('unseen_rendered', 'unseen_never_rendered') if n in scores['combined']]
    rows = [(name, int(scores.get(f'num_{name}', scores['num_images'])), s['score'],
             s['grapheme_root'], s['vowel_diacritic'], s['consonant_diacritic'],
             scores['heads'][name]['score'])
            for name, s in scores['combined'].items() if name != 'unseen' or len(parts) > 1]
    note = ('Hierarchical macro recall, (2 root + vowel + consonant) / 4. rule: the '
            f'prediction rule ({self.rule()}), which the submission uses; root, vowel, '
            'consonant: its macro recall per component; heads: the argmax of the component '
            'heads alone. seen: graphemes training has real images of; unseen_rendered: '
            'only rendered ones; unseen_never_rendered: neither.')
    return (('subset', 'images', 'rule', 'root', 'vowel', 'consonant', 'heads'), rows, note)

  def report_sections(self, scores, details):
    return report.sections(self.split, scores, details, self.source)


def predict(config, model, workdir):
  """Writes workdir/submission.csv: row_id,target in exactly the order of test.csv.

  A Kaggle folder's test images are read straight from its parquet files, a window of
  config.predict.window_rows images at a time (config.predict.read='stream'), or from the
  prepared copy ('prepared': converted once, cached, as training reads).
  """
  counts = log_counts(config, workdir, config.predict.tau)

  def components(forward, batch):
    out = outputs(forward, batch['image'], config)
    return {'components': decide(out, seen_threshold=config.predict.seen_threshold,
                                 tau=config.predict.tau, log_counts=counts)}

  if config.data.format == 'kaggle' and config.predict.read == 'stream':
    # Checked whole before the first image is predicted: a bad file never costs a run.
    split = kaggle.validate(config.data.dir, 'test')
    image_ids = []

    def sources():
      for ids, source in _test_windows(split, config.predict.window_rows):
        image_ids.extend(ids)
        yield source
        del source  # before the next window is decoded: memory holds one at a time

    console.say(f'Predicting the test images of {config.data.dir}, read from its parquet '
                'files a window at a time...')
    by_row = np.concatenate([rows['components'] for rows in inference.outputs_by_source(
        model, components, sources(), batch_size=config.eval.batch_size,
        what='predicting a window of test images')])
  else:
    src = data.source(config, workdir, 'test')
    image_ids = src.image_ids
    by_row = inference.outputs_by_row(model, components, src,
                                       batch_size=config.eval.batch_size,
                                       what=f'predicting {len(src):,} test images')['components']
  by_row = classes.to_competition(by_row)  # Kaggle scores the 7 consonant classes
  position = {image_id: i for i, image_id in enumerate(image_ids)}
  column = {name: i for i, name in enumerate(kaggle.COMPONENTS)}
  rows = kaggle.test_rows(config.data.dir)
  targets = [by_row[position[image_id], column[component]] for _, image_id, component in rows]
  path = files.join(workdir, 'submission.csv')
  if jax.process_index() == 0:
    write_submission(path, [r[0] for r in rows], targets)
  return path


def _test_windows(split, window_rows):
  """Yields (image ids, grain source) for the images of a validated split (kaggle.Split) in
  file order, `window_rows` at a time (0: a whole file), each decoded only when iteration
  reaches it. Peak memory is one window's pixels (32 KB an image), whatever the number of
  images; a window smaller than a one-row-group file decodes that file once per window.
  """
  for shard in split.shards:
    n = len(shard.image_ids)
    size = window_rows or n
    for begin in range(0, n, size):
      end = min(n, begin + size)
      images = np.empty((end - begin, kaggle.NUM_PIXELS), np.uint8)
      shard.read_rows(images, np.arange(end - begin), begin, end)
      yield shard.image_ids[begin:end], _ArraySource(images)
      del images


class _ArraySource:
  """A grain source over images held in memory, [N, 32332] uint8, for predict's windows."""

  def __init__(self, images):
    self.images = images.reshape(len(images), kaggle.HEIGHT, kaggle.WIDTH)

  def __len__(self):
    return len(self.images)

  def __getitem__(self, index):
    return dict(image=self.images[index], index=np.int32(index))


def write_submission(path, row_ids, targets):
  """Writes row_id,target atomically: a crash never leaves a partial submission."""
  if len(row_ids) != len(targets):
    raise ValueError(f'{len(row_ids)} row ids but {len(targets)} targets')
  files.write_atomic(path, 'row_id,target\n' + ''.join(
      f'{r},{int(t)}\n' for r, t in zip(row_ids, targets)))
