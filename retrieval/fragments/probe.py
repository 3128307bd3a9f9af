"""A k-NN probe: how well a model's backbone already retrieves writers, with no head and no
post-processing. Any run on fragment data can name it (config.evals.NAME.type =
'knn_probe' in the fragment and MaskFeat tasks): it reads only what every model has
(protocols.Model's backbone, pooled by `features`, the fragment and MaskFeat tasks'
protocols.Features).

Each patch's pooled backbone features, summed over the fragment's patches, power-normalised
(eval.power, its own setting: Peer et al.'s 0.4 unless the config sets it) and L2 (retrieval/features/aggregate.py), each fragment a query against all others
(retrieval/fragments/metrics.py). 'score' is the writer mAP.
"""
import jax.numpy as jnp

from bengrapheme import errors, inference, report
from retrieval.features import aggregate
from retrieval.fragments import data, metrics
from retrieval.fragments.evaluate import labelings
from retrieval.fragments.model import preprocess


def features(model, images):
  """The backbone's output pooled over all but the batch and channel axes (a feature map's
  positions, a ViT's tokens)."""
  out = model.backbone(images, train=False)
  return out.reshape(out.shape[0], -1, out.shape[-1]).astype(jnp.float32).mean(1)


def probe_scores(features, src, power):
  """Writer and page retrieval scores of per-patch `features` [len(src), D] of `src`."""
  descriptors = aggregate.fragment_descriptors(features, src.starts, method='sum', alpha=power)
  return metrics.retrieval_metrics(descriptors, labelings(src))


class KnnProbe:
  SETTINGS = {'power': 0.4}  # bengrapheme/evaluators.py: what config.eval need not hold

  def __init__(self, config, split, workdir):
    # data.source raises inference.Unlabelled for a collection: no writers to score.
    self.config, self.split = config, split
    self.source = data.source(config, workdir, split)

  def run(self, model, chosen=None, tune=False):
    del chosen, tune  # nothing to choose
    config, src = self.config, self.source
    if model.features is None:
      raise errors.UserError(f'evals.{self.split}: the k-NN probe reads the features of the '
                             f'task {config.task!r}, which provides none (protocols.Features)')
    pooled = inference.outputs_by_row(
        model._replace(apply=model.features),
        lambda forward, batch: {'features': forward(preprocess(batch['image'], config))},
        src, batch_size=config.eval.batch_size,
        what=f'backbone features of {len(src):,} {self.split} patches')['features']
    probe = probe_scores(pooled, src, config.eval.power)
    return dict(probe, score=probe['writer']['map']), None

  def headline(self, scores):
    return f"k-NN probe writer mAP {scores['score']:.4f}"

  def summary(self, scores):
    w, p = scores['writer'], scores['page']
    return (('writer mAP', 'Top-1', 'Pr@10', 'page mAP', 'page Top-1'),
            [(w['map'], w['top1'], w['pr10'], p['map'], p['top1'])],
            f'k-NN probe on {self.split!r}: fragment descriptors from the backbone as it is '
            '(pooled features summed over patches), each fragment a query against all others.')

  def report_sections(self, scores, details):
    del details
    return report.summary_sections(f'k-NN probe: split {self.split!r}', self.summary(scores))
