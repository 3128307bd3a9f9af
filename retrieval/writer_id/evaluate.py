"""Writer identification accuracy on the held-out pages: of each patch (its argmax) and of
each fragment (the argmax of its patches' summed log-probabilities). 'score' is the
fragment accuracy: a scholar attributes a fragment, not a patch."""
import jax
import numpy as np

from bengrapheme import inference, report
from retrieval.writer_id import data
from retrieval.fragments.model import preprocess


class Accuracy:

  def __init__(self, config, split, workdir):
    if split != 'val':
      raise inference.Unlabelled(f"split {split!r}: writer identification scores the "
                                  "held-out pages of train/'s writers, split 'val'")
    self.config, self.split = config, split
    self.source = data.splits(config, workdir)['val']

  def run(self, model, chosen=None, tune=False):
    del chosen, tune  # nothing to choose
    src, config = self.source, self.config
    log_probs = inference.outputs_by_row(
        model, lambda forward, batch: {
            'log_probs': jax.nn.log_softmax(forward(preprocess(batch['image'], config)))},
        src, batch_size=config.eval.batch_size,
        what=f'classifying {len(src):,} held-out patches')['log_probs']
    summed = np.add.reduceat(log_probs, src.starts[:-1], axis=0)
    scores = {'patch_accuracy': float(np.mean(log_probs.argmax(-1) == src.labels)),
              'fragment_accuracy': float(np.mean(summed.argmax(-1) == src.fragment_labels)),
              'num_fragments': len(src.fragments), 'num_writers': log_probs.shape[1]}
    return dict(scores, score=scores['fragment_accuracy']), None

  def headline(self, scores):
    return (f"fragment accuracy {scores['score']:.4f} (patches "
            f"{scores['patch_accuracy']:.4f})")

  def summary(self, scores):
    return (('fragments', 'writers', 'fragment accuracy', 'patch accuracy'),
            [(scores['num_fragments'], scores['num_writers'], scores['fragment_accuracy'],
              scores['patch_accuracy'])],
            'Closed-set writer identification of the held-out pages: a fragment is named by '
            "the sum of its patches' log-probabilities; a patch by its own.")

  def report_sections(self, scores, details):
    del details
    return report.summary_sections(f'Writer identification: split {self.split!r}', self.summary(scores))
