"""The MaskFeat evaluator: how well the trunk predicts held-out patches' HOG, and how well its
features already retrieve writers (a k-NN probe, no training).

  reconstruction  the masked HOG error (the training loss) on every patch of the split, each
                  with its own mask drawn from (seed, patch index): the same masks at every
                  evaluation, so the curve compares checkpoints;
  probe           retrieval/fragments/probe.py's k-NN probe of the trunk as it is (the mean token of
                  each unmasked patch), from the same pass.
'score' is the probe's writer mAP: a pre-trained trunk is wanted for retrieval, and the loss
can fall on what retrieval does not need.
"""
import jax
import numpy as np

from bengrapheme import inference, report
from retrieval.maskfeat import losses
from retrieval.fragments.model import preprocess
from retrieval.fragments.probe import KnnProbe, probe_scores


class Evaluator(KnnProbe):
  """KnnProbe's split, with the reconstruction error measured in the same pass."""

  def run(self, model, chosen=None, tune=False):
    del chosen, tune  # nothing to choose
    config, src = self.config, self.source
    tokens = losses.tokens_of(config)
    base = jax.random.key(config.seed)

    def predict(forward, batch):
      images = preprocess(batch['image'], config)
      keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(batch['index'])
      mask = jax.vmap(lambda k: losses.random_mask(k, 1, tokens, config.maskfeat.mask_ratio)[0])(
          keys)
      errors = losses.masked_errors(forward, images, mask, config)
      return {'error': errors, 'features': forward({'image': images})['features']}

    out = inference.outputs_by_row(model, predict, src, batch_size=config.eval.batch_size,
                                    what=f'MaskFeat on {len(src):,} {self.split} patches')
    probe = probe_scores(out['features'], src, config.eval.power)
    scores = {'reconstruction': {'loss': float(np.mean(out['error']))}, 'probe': probe,
              'score': probe['writer']['map']}
    return scores, None

  def headline(self, scores):
    return (f"k-NN probe writer mAP {scores['score']:.4f} (masked HOG error "
            f"{scores['reconstruction']['loss']:.4f})")

  def summary(self, scores):
    w, p = scores['probe']['writer'], scores['probe']['page']
    return (('masked HOG error', 'writer mAP', 'Top-1', 'Pr@10', 'page mAP', 'page Top-1'),
            [(scores['reconstruction']['loss'], w['map'], w['top1'], w['pr10'], p['map'],
              p['top1'])],
            f'masked HOG error: the training loss on the {self.split!r} patches (fixed '
            'masks). The rest: the k-NN probe, fragment descriptors from the pre-trained '
            'trunk as it is (mean token, summed over patches), each fragment a query against '
            'all others.')

  def report_sections(self, scores, details):
    del details
    return report.summary_sections(f'MaskFeat pre-training: split {self.split!r}', self.summary(scores))
