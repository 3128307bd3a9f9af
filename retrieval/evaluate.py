"""The fragment evaluator: writer and page retrieval of the encoder, of the SRS-LBP baseline,
of each re-ranked, and of their fusion, plus the N x N distance export.

The encoder embeds every patch of a fragment (retrieval/patches.py); the fragment's
descriptor is their aggregation, power-normalised (retrieval/aggregate.py), optionally
PCA-whitened: fitted on the evaluated set's own descriptors ('self': transductive, no labels,
as Peer et al. do) or on the training split's ('train'). Every method is its own block of
scores, so a reader sees what each step buys:

  encoder            aggregated patch embeddings (Euclidean on L2-normalised rows)
  encoder_whitened   + PCA-whitening (eval.whitening)
  encoder_reranked   + SGR re-ranking (eval.rerank)
  srs_lbp            the organisers' baseline (test split; L1 on Hellinger-PCA histograms)
  srs_lbp_reranked   SGR on its embeddings
  fused              the mean of the z-normalised distances of the encoder (after
                     whitening, if on) and SRS-LBP (eval.fusion)
"""
import concurrent.futures
import os

import jax
import numpy as np

from bengrapheme import cache, console, evaluation, files
from retrieval import aggregate, data, distances_io, lbp, metrics, pca, reader, report
from retrieval.model import preprocess


def patch_embeddings(config, model, src):
  """Embeddings [len(src), D] of every patch of the PatchSource `src`."""
  def forward_embeddings(forward, batch):
    return {'embedding': forward(preprocess(batch['image'], config))}

  return evaluation.outputs_by_row(model, forward_embeddings, src,
                                   batch_size=config.eval.batch_size,
                                   what=f'embedding {len(src):,} patches')['embedding']


def descriptors(config, model, src):
  """Fragment descriptors [N, D] of a PatchSource (aggregated, power-normalised, L2)."""
  x = patch_embeddings(config, model, src)
  centres = None
  if config.eval.aggregation == 'vlad':  # centres from the evaluated set's own patches
    centres = aggregate.fit_centres(x, config.eval.vlad_centres, config.seed)
  return aggregate.fragment_descriptors(x, src.starts, method=config.eval.aggregation,
                                        alpha=config.eval.power, centres=centres)


def labelings(src):
  return {'writer': src.writer_ids, 'page': src.page_ids}


def lbp_features(src, indices, what):
  """SRS-LBP features of fragments `indices` of a reader.FragmentSource, at their own
  resolution (threads: numpy frees the GIL)."""
  def one(i):
    return lbp.lbp_features(reader.convert(src.read_rgb(i), color=False))

  features = []
  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool, \
      console.Progress(len(indices), what, unit='fragment') as progress:
    for x in pool.map(one, indices):
      features.append(x)
      progress.update()
  return np.stack(features)


def srs_lbp_embeddings(config, workdir):
  """The SRS-LBP embeddings [N, 200] of the test split (PCA fitted on train), computed once
  per dataset: kept in WORKDIR/eval/srs_lbp_test-KEY.npy, KEY naming the fragment files of
  both splits (and the fit settings), so evaluating the workdir on other data recomputes."""
  train_list, test_list = data.listing(config, 'train'), data.listing(config, 'test')
  key = cache.key_of('srs_lbp', [*data.source_files(config, train_list, 'train')[0],
                                 *data.source_files(config, test_list, 'test')[0]],
                     [config.seed, config.eval.lbp_fit_fragments])
  path = files.join(workdir, 'eval', f'srs_lbp_test-{key}.npy')
  if files.exists(path):
    return files.load_npy(path)
  # The listings are in the order of the patch caches, so row i of the features is fragment
  # i of the test source; read from the folder or the TFDS build alike.
  console.say(f'SRS-LBP baseline, once per dataset (kept in {path}): features of train '
              'fragments for its PCA, then of the test fragments...')
  fit_on = np.random.default_rng(config.seed).permutation(len(train_list))
  train_features = lbp_features(train_list, fit_on[:config.eval.lbp_fit_fragments],
                                'SRS-LBP features (train, PCA fit)')
  test_features = lbp_features(test_list, range(len(test_list)), 'SRS-LBP features (test)')
  fitted = pca.fit(train_features, dim=min(200, len(train_features) - 1,
                                           train_features.shape[1]))
  embeddings = lbp.embed(fitted, test_features)
  if jax.process_index() == 0:
    files.save_npy(path, embeddings)
  return embeddings


class Evaluator:
  """Retrieval scores {method: {'writer' | 'page': {map, top1, pr10, pr100, num_queries}}}
  for the methods of the module docstring that the config switches on; 'score' is the
  encoder's writer mAP after its last configured step. Details, for the report: per
  embedding method, its embeddings, the metric they are ranked by and each query's AP."""

  def __init__(self, config, split, workdir):
    self.config, self.split, self.workdir = config, split, workdir
    self.source = data.source(config, workdir, split)
    self.listing = data.listing(config, split)

  def run(self, model):
    config, e, src = self.config, self.config.eval, self.source
    x = descriptors(config, model, src)
    embedded = {'encoder': (x, 'euclidean')}  # retrieval_metrics' default metric
    if e.whitening not in ('none', 'self', 'train'):
      raise ValueError(f"eval.whitening={e.whitening!r}: expected 'none', 'self' or 'train'")
    if e.whitening != 'none':
      fit_on = x if e.whitening == 'self' else descriptors(
          config, model, data.source(config, self.workdir, 'train'))
      whitening = pca.fit(fit_on, min(e.whitening_dims, len(fit_on) - 1, fit_on.shape[1]),
                          whiten=True)
      embedded['encoder_whitened'] = (pca.l2_normalise(pca.project(whitening, x)),
                                      'euclidean')
    encoder_last = list(embedded)[-1]
    if e.srs_lbp and self.split == 'test':
      embedded['srs_lbp'] = (srs_lbp_embeddings(config, self.workdir), 'cityblock')
    matrices = {}  # methods known by their distance matrix alone
    if e.rerank:
      # On centred rows: uncentred descriptors have cosine similarities near 1 for every
      # pair, which flattens SGR's dense affinity (measured: it then always hurt).
      centred = lambda emb: pca.l2_normalise(emb - emb.mean(axis=0))
      for name, method in (('encoder_reranked', encoder_last), ('srs_lbp_reranked', 'srs_lbp')):
        if method in embedded:
          matrices[name] = aggregate.sgr(centred(embedded[method][0]), k=e.rerank_k,
                                         gamma=e.rerank_gamma)
    if e.fusion and 'srs_lbp' in embedded:
      matrices['fused'] = aggregate.fuse(self._matrix(embedded, encoder_last),
                                         self._matrix(embedded, 'srs_lbp'))

    scores, details = {}, {}
    for method, (emb, metric) in embedded.items():
      scores[method] = metrics.retrieval_metrics(emb, labelings(src), metric=metric,
                                                 per_query=True)
      ap = {labeling: block.pop('ap') for labeling, block in scores[method].items()}
      details[method] = dict(embeddings=emb, metric=metric, ap=ap)
    for method, d in matrices.items():
      scores[method] = metrics.metrics_from_distances(d, labelings(src))
    scores['score'] = scores['encoder_reranked' if e.rerank else encoder_last]['writer']['map']
    if e.export_distances and jax.process_index() == 0:
      self._export(matrices.get(e.export_method) if e.export_method in matrices
                   else self._matrix(embedded, e.export_method))
    return scores, details

  def _matrix(self, embedded, method):
    if method not in embedded:
      raise ValueError(f'eval.export_method={method!r}: expected one of the methods scored: '
                       f'{", ".join(embedded)}, encoder_reranked, srs_lbp_reranked, fused')
    emb, metric = embedded[method]
    return metrics.distance_matrix(emb, metric=metric)

  def _export(self, distances):
    eval_dir = files.join(self.workdir, 'eval')
    files.save_npy(files.join(eval_dir, f'distances_{self.split}.npy'), distances)
    distances_io.write_distance_csv(files.join(eval_dir, f'distances_{self.split}.csv'),
                                    distances, self.source.names,
                                    header=self.config.eval.export_csv_header)

  def summary(self, scores):
    """(header, rows) of the headline scores, for the console: one row a method."""
    rows = [(method, b['writer']['map'], b['writer']['top1'], b['writer']['pr10'],
             b['writer']['pr100'], b['page']['map'], b['page']['top1'])
            for method, b in scores.items() if isinstance(b, dict)]
    return ('method', 'writer mAP', 'Top-1', 'Pr@10', 'Pr@100', 'page mAP', 'page Top-1'), rows

  def report_sections(self, scores, details):
    return report.sections(self.split, scores, details, self.source, self.listing)
