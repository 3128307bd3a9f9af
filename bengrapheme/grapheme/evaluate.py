"""The grapheme evaluator (hierarchical macro recall, seen vs unseen graphemes) and the Kaggle
submission, both fed by the one eval loop (bengrapheme/evaluation.py)."""
import jax
import jax.numpy as jnp
import numpy as np

from bengrapheme import evaluation, files, metrics
from bengrapheme.grapheme import classes, data, kaggle, report
from bengrapheme.grapheme.model import preprocess

# Triple of each whole-grapheme class, to turn a whole-grapheme prediction into components.
GRAPHEME_TRIPLES = np.array([g[:3] for g in classes.GRAPHEMES], np.int32)


def predict_components(logits, seen_threshold):
  """Component labels [B, 3] from the heads.

  With a whole-grapheme head (the winning Bengali.AI recipe): where it is confident that the
  image is one of the 1,295 known graphemes, that grapheme's components are used; otherwise
  (an unseen grapheme, most likely) the component heads decide.
  """
  components = jnp.stack([jnp.argmax(logits[n], -1) for n in kaggle.COMPONENTS], -1)
  if 'grapheme' not in logits:
    return components
  probs = jax.nn.softmax(logits['grapheme'], -1)
  seen = jnp.max(probs, -1) >= seen_threshold
  from_grapheme = jnp.asarray(GRAPHEME_TRIPLES)[jnp.argmax(probs, -1)]
  return jnp.where(seen[:, None], from_grapheme, components)


class Evaluator:
  """Hierarchical macro recall on one split, over all images and over seen / unseen graphemes.

  Scores {rule: {subset: {score, grapheme_root, vowel_diacritic, consonant_diacritic}}} for
  the rules 'heads' (the component heads alone) and, with a whole-grapheme head, 'combined'
  (the rule predictions use); a subset with no image is left out. 'score' is the prediction
  rule over all images. Details, for the report: per image in row order, `labels`,
  `predictions` of that rule and `seen` (its grapheme is one of the 1,295).
  """

  def __init__(self, config, split, workdir):
    self.config, self.split = config, split
    self.source = data.source(config, workdir, split)
    # Kaggle's test split has no labels (-1 everywhere): checked on the first row.
    if not (len(self.source) and self.source[0]['labels'][0] >= 0):
      raise ValueError(f"split {split!r} has no labels to score (Kaggle's test.csv has none; "
                       'evaluate on val, or on synthetic data with test_labels.csv)')
    self.rules = ('heads', 'combined') if config.model.grapheme_head else ('heads',)

  def run(self, model):
    config = self.config

    def predict(forward, batch):
      logits = forward(preprocess(batch['image'], config))
      out = {'heads': predict_components({n: logits[n] for n in kaggle.COMPONENTS}, 1.0)}
      if 'combined' in self.rules:
        out['combined'] = predict_components(logits, config.predict.seen_threshold)
      return dict(out, labels=batch['labels'], seen=batch['grapheme'] >= 0)

    rows = evaluation.outputs_by_row(model, predict, self.source,
                                     batch_size=config.eval.batch_size,
                                     keys=('image', 'labels', 'grapheme'))
    labels, seen = rows['labels'], rows['seen']
    subsets = {'all': np.ones_like(seen), 'seen': seen, 'unseen': ~seen}
    scores = {rule: {name: metrics.hierarchical_macro_recall(labels[among], rows[rule][among])
                     for name, among in subsets.items() if among.any()}
              for rule in self.rules}
    rule = self.rules[-1]
    scores.update(score=scores[rule]['all']['score'], num_images=len(labels),
                  num_seen=int(seen.sum()), num_unseen=int((~seen).sum()))
    return scores, dict(rule=rule, labels=labels, predictions=rows[rule], seen=seen)

  def report_sections(self, scores, details):
    return report.sections(self.split, scores, details, self.source)


def predict(config, model, workdir):
  """Writes workdir/submission.csv: row_id,target in exactly the order of test.csv."""
  src = data.source(config, workdir, 'test')
  rows = kaggle.test_rows(config.data.dir)

  def components(forward, batch):
    logits = forward(preprocess(batch['image'], config))
    return {'components': predict_components(logits, config.predict.seen_threshold)}

  by_row = evaluation.outputs_by_row(model, components, src,
                                     batch_size=config.eval.batch_size)['components']
  position = {image_id: i for i, image_id in enumerate(src.image_ids)}
  column = {name: i for i, name in enumerate(kaggle.COMPONENTS)}
  targets = [by_row[position[image_id], column[component]] for _, image_id, component in rows]
  path = files.join(workdir, 'submission.csv')
  if jax.process_index() == 0:
    write_submission(path, [r[0] for r in rows], targets)
  return path


def write_submission(path, row_ids, targets):
  """Writes row_id,target atomically: a crash never leaves a partial submission."""
  if len(row_ids) != len(targets):
    raise ValueError(f'{len(row_ids)} row ids but {len(targets)} targets')
  files.write_atomic(path, 'row_id,target\n' + ''.join(
      f'{r},{int(t)}\n' for r, t in zip(row_ids, targets)))
