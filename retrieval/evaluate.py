"""The fragment evaluator: writer and page retrieval of the encoder's embeddings, beside the
SRS-LBP baseline and the optional PCA-whitened encoder, and the N x N distance export."""
import concurrent.futures
import os

import jax
import numpy as np

from bengrapheme import evaluation, files
from retrieval import data, distances_io, lbp, metrics, pca, reader, report
from retrieval.model import preprocess


def embed(config, model, src):
  """Embeddings [N, D] of every fragment of `src`, in its row order."""
  def forward_embeddings(forward, batch):
    return {'embedding': forward(preprocess(batch['image'], config))}

  return evaluation.outputs_by_row(model, forward_embeddings, src,
                                   batch_size=config.eval.batch_size)['embedding']


def labelings(src):
  return {'writer': src.writer_ids, 'page': src.page_ids}


def lbp_features(src, indices):
  """SRS-LBP features of fragments `indices` of a reader.FragmentSource, at their own
  resolution (threads: numpy frees the GIL)."""
  def one(i):
    return lbp.lbp_features(reader.convert(src.read_rgb(i), color=False))

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    return np.stack(list(pool.map(one, indices)))


def srs_lbp_embeddings(config, workdir):
  """The SRS-LBP embeddings [N, 200] of the test split (PCA fitted on train), computed once
  and kept in WORKDIR/eval/srs_lbp_test.npy (the features take minutes; the model's
  checkpoint does not change them)."""
  path = files.join(workdir, 'eval', 'srs_lbp_test.npy')
  if files.exists(path):
    return files.load_npy(path)
  # The listings in the order of the caches (which data.source builds from them), so row i
  # of the features is fragment i of the test source; read from the folder or the TFDS build.
  train_list, test_list = data.listing(config, 'train'), data.listing(config, 'test')
  fit_on = np.random.default_rng(config.seed).permutation(len(train_list))
  train_features = lbp_features(train_list, fit_on[:config.eval.lbp_fit_fragments])
  test_features = lbp_features(test_list, range(len(test_list)))
  fitted = pca.fit(train_features, dim=min(200, len(train_features) - 1,
                                           train_features.shape[1]))
  embeddings = lbp.embed(fitted, test_features)
  if jax.process_index() == 0:
    files.save_npy(path, embeddings)
  return embeddings


class Evaluator:
  """Writer and page retrieval: {method: {'writer' | 'page': {map, top1, pr10, pr100,
  num_queries}}} for 'encoder', 'encoder_whitened' (config.eval.pca_whitening dims, fitted on
  the train embeddings) and 'srs_lbp' (test split, config.eval.srs_lbp); 'score' is the
  encoder's writer mAP. Details, for the report: the source and, per method, its embeddings,
  the metric they are ranked by and each query's AP (from the metrics kernel)."""

  def __init__(self, config, split, workdir):
    self.config, self.split, self.workdir = config, split, workdir
    self.source = data.source(config, workdir, split)

  def run(self, model):
    config, split, src = self.config, self.split, self.source
    embeddings = embed(config, model, src)
    methods = {'encoder': (embeddings, 'euclidean')}  # retrieval_metrics' default metric
    if config.eval.pca_whitening and split != 'train':
      train_embeddings = embed(config, model, data.source(config, self.workdir, 'train'))
      whitening = pca.fit(train_embeddings, config.eval.pca_whitening, whiten=True)
      methods['encoder_whitened'] = (pca.l2_normalise(pca.project(whitening, embeddings)),
                                     'euclidean')
    if config.eval.srs_lbp and split == 'test':
      methods['srs_lbp'] = (srs_lbp_embeddings(config, self.workdir), 'cityblock')
    scores, ranked = {}, {}
    for method, (x, metric) in methods.items():
      scores[method] = metrics.retrieval_metrics(x, labelings(src), metric=metric,
                                                 per_query=True)
      ap = {labeling: block.pop('ap') for labeling, block in scores[method].items()}
      ranked[method] = dict(embeddings=x, metric=metric, ap=ap)
    scores['score'] = scores['encoder']['writer']['map']
    if config.eval.export_distances and jax.process_index() == 0:
      distances = metrics.distance_matrix(embeddings)
      files.save_npy(files.join(self.workdir, 'eval', f'distances_{split}.npy'), distances)
      distances_io.write_distance_csv(
          files.join(self.workdir, 'eval', f'distances_{split}.csv'), distances, src.names)
    return scores, ranked

  def report_sections(self, scores, details):
    return report.sections(self.split, scores, details, self.source)
