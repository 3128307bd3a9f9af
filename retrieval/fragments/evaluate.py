"""The fragment evaluator: writer and page retrieval of the encoder, of the SRS-LBP baseline
and of the post-processing chosen on the validation split, plus the N x N distance export.

The encoder embeds every patch of a fragment (retrieval/features/patches.py); the fragment's
descriptor is their aggregation, power-normalised and L2-normalised (retrieval/features/aggregate.py).
Post-processing, each step off at its first grid value:

  power           eval.power: sign(x) |x|^p before the L2 normalisation
  whitening_dims  PCA-whitening to this many dims (0: none), fitted on the evaluated set's
                  own descriptors (eval.whitening='self': transductive, no labels, as Peer et
                  al.) or on the training split's ('train')
  rerank_k        SGR re-ranking with k neighbours (0: none), on centred descriptors
  fusion_weight   w in (1 - w) z(encoder) + w z(SRS-LBP), z the z-normalised distances (0: none)

Methods, each its own block of scores:

  encoder     the descriptor alone: eval.aggregation and eval.power, nothing after
  srs_lbp     the organisers' baseline (L1 on Hellinger-PCA histograms)
  configured  eval's own post-processing, when it turns any step on
  tuned       the settings the split eval.tune_split chose: on that split itself, its
              best (in-sample: a choice, not an estimate); on every other split, that choice
              applied unchanged (the honest figure). 'tuned_settings' says what and where.

Tuning never looks at test: the val split (writers held out of train/, retrieval/fragments/data.py)
chooses, stage by stage in pipeline order (power, whitening, re-ranking, fusion), each stage
keeping the value with the best val writer mAP given the earlier choices; a tie keeps the
earlier value of the grid, so a step that does not help stays off.
"""
import jax
import numpy as np

from bengrapheme import cache, console, errors, inference, files
from retrieval.features import aggregate, lbp, pca
from retrieval.fragments import data, distances_io, metrics, report
from retrieval.fragments.model import preprocess

# The grids the val split tunes over, in pipeline order; the first value of each is "off".
GRIDS = (('power', (1.0, 0.7, 0.4)),
         ('whitening_dims', (0, 16, 32, 64, 128, 256, 512)),
         ('rerank_k', (0, 1, 2, 4, 8)),
         ('fusion_weight', (0.0, 0.1, 0.25, 0.5, 0.75)))
SETTINGS = tuple(name for name, _ in GRIDS)
_lbp_pcas = {}  # SRS-LBP's PCA by the key of its train features, fitted once per process


def embedding_fn(config):
  """What inference.outputs_by_row runs on a batch of patches: their embeddings."""
  def forward_embeddings(forward, batch):
    return {'embedding': forward(preprocess(batch['image'], config))}
  return forward_embeddings


def patch_embeddings(config, model, src):
  """Embeddings [len(src), D] of every patch of the PatchSource `src`."""
  return inference.outputs_by_row(model, embedding_fn(config), src,
                                   batch_size=config.eval.batch_size,
                                   what=f'embedding {len(src):,} patches')['embedding']


def labelings(src):
  return {'writer': src.writer_ids, 'page': src.page_ids}


def lbp_features(src, indices, what):
  """SRS-LBP features [len(indices), 3072] of fragments `indices` of a reader.FragmentSource
  at their own resolution, each decoded once (lbp.features_of)."""
  rows = []
  with console.Progress(len(indices), what, unit='fragment') as progress:
    for x in lbp.features_of(src.read_rgb, indices):
      rows.append(x)
      progress.update()
  return np.stack(rows)


def lbp_pca(config, workdir):
  """SRS-LBP's PCA (200 dims), fitted on the features of eval.lbp_fit_fragments train
  fragments drawn by the seed. The features are computed once per dataset, whichever splits
  are scored: kept in WORKDIR/eval/srs_lbp_fit-KEY.npy, KEY naming the train fragment files
  and the draw, so evaluating the workdir on other data recomputes."""
  train_list = data.listing(config, 'train')
  key = cache.key_of('srs_lbp_fit', data.source_files(config, train_list, 'train')[0],
                     [config.seed, config.eval.lbp_fit_fragments])
  if key not in _lbp_pcas:
    path = files.join(workdir, 'eval', f'srs_lbp_fit-{key}.npy')
    if files.exists(path):
      features = files.load_npy(path)
    else:
      console.say(f'SRS-LBP baseline: features of train fragments for its PCA, once per '
                  f'dataset (kept in {path})...')
      fit_on = np.random.default_rng(config.seed).permutation(len(train_list))
      features = lbp_features(train_list, fit_on[:config.eval.lbp_fit_fragments],
                              'SRS-LBP features (train, PCA fit)')
      if jax.process_index() == 0:
        files.save_npy(path, features)
    _lbp_pcas[key] = pca.fit(features, dim=min(200, len(features) - 1, features.shape[1]))
  return _lbp_pcas[key]


def srs_lbp_embeddings(config, workdir, src):
  """The SRS-LBP embeddings [N, 200] of a split's PatchSource `src`: its fragments' features
  (computed with its patches, from the same decode) through the train-fitted PCA."""
  return lbp.embed(lbp_pca(config, workdir), src.lbp())


def configured_settings(config):
  return {name: config.eval[name] for name in SETTINGS}


class Pipeline:
  """One split's patch embeddings (and SRS-LBP embeddings) -> the distances of any settings.

  whitening_fit(power) gives the descriptors PCA-whitening is fitted on for that power."""

  def __init__(self, config, x, starts, lbp_embeddings, whitening_fit):
    self.config, self.starts, self.lbp = config, starts, lbp_embeddings
    self.x, self.whitening_fit = x, whitening_fit
    self.centres = None
    if config.eval.aggregation == 'vlad':  # centres from the evaluated set's own patches
      self.centres = aggregate.fit_centres(x, config.eval.vlad_centres, config.seed)
    self._lbp_distances = None

  def descriptors(self, power, whitening_dims=0):
    """Fragment descriptors [N, D]: aggregated, power-normalised, L2, optionally whitened."""
    e = self.config.eval
    x = aggregate.fragment_descriptors(self.x, self.starts, method=e.aggregation, alpha=power,
                                       centres=self.centres)
    if not whitening_dims:
      return x
    fit_on = x if e.whitening == 'self' else self.whitening_fit(power)
    limit = min(len(fit_on) - 1, x.shape[1])
    if whitening_dims > limit:
      raise ValueError(f'whitening to {whitening_dims} dims: at most {limit} here (descriptors '
                       f'of {x.shape[1]} dims, fitted on {len(fit_on)} fragments)')
    whitening = pca.fit(fit_on, whitening_dims, whiten=True)
    return pca.l2_normalise(pca.project(whitening, x))

  def whitening_limit(self):
    fit_on = len(self.starts) - 1 if self.config.eval.whitening == 'self' else np.inf
    return min(fit_on - 1, self.descriptors(1.0).shape[1])

  def lbp_distances(self):
    if self._lbp_distances is None:
      self._lbp_distances = metrics.distance_matrix(self.lbp, metric='cityblock')
    return self._lbp_distances

  def distances(self, s):
    """[N, N] float32 distances of settings `s` (a dict of SETTINGS)."""
    x = self.descriptors(s['power'], s['whitening_dims'])
    if s['rerank_k']:
      # On centred rows: uncentred descriptors have cosine similarities near 1 for every
      # pair, which flattens SGR's dense affinity (measured: it then always hurt).
      d = aggregate.sgr(pca.l2_normalise(x - x.mean(axis=0)), k=s['rerank_k'],
                        gamma=self.config.eval.rerank_gamma)
    else:
      d = metrics.distance_matrix(x)
    if s['fusion_weight']:
      if self.lbp is None:
        raise ValueError(f'fusion_weight={s["fusion_weight"]} needs SRS-LBP: '
                         'config.eval.srs_lbp is off')
      w = s['fusion_weight']
      d = ((1 - w) * aggregate.z_normalise(d) +
           w * aggregate.z_normalise(self.lbp_distances())).astype(np.float32)
    return d


def choose_settings(pipeline, labels):
  """The settings with the best writer mAP, stage by stage (module docstring), and each
  tried value's writer mAP {setting: {value: mAP}}."""
  chosen = {name: grid[0] for name, grid in GRIDS}
  tried = {}
  for name, grid in GRIDS:
    if name == 'whitening_dims':
      grid = [v for v in grid if v <= pipeline.whitening_limit()]
    if name == 'fusion_weight' and pipeline.lbp is None:
      grid = grid[:1]
    tried[name] = {}
    for value in grid:
      d = pipeline.distances({**chosen, name: value})
      tried[name][str(value)] = metrics.metrics_from_distances(d, labels['writer'])['map']
    chosen[name] = max(grid, key=lambda v: tried[name][str(v)])  # max keeps the first of ties
  return chosen, tried


class Evaluator:
  """Retrieval scores {method: {'writer' | 'page': {map, top1, pr10, pr100, num_queries}}}
  for the methods of the module docstring; 'score' is the writer mAP of 'tuned' (of
  'configured', or of 'encoder', when there is no tuning); 'tuned_settings' the settings
  'tuned' used and the split that chose them; on the tuning split, 'tuning' the writer mAP of
  every value tried. Details, for the report: per embedding method, its embeddings, the
  metric they are ranked by and each query's AP."""

  def __init__(self, config, split, workdir):
    self.config, self.split, self.workdir = config, split, workdir
    self.source = data.source(config, workdir, split)
    self.listing = data.listing(config, split)

  def pipeline(self, model, src):
    config = self.config
    lbp_embeddings = (srs_lbp_embeddings(config, self.workdir, src) if config.eval.srs_lbp
                      else None)
    train = []

    def whitening_fit(power):  # the training split's descriptors, embedded once if asked
      if not train:
        train_src = data.source(config, self.workdir, 'train')
        train.append((patch_embeddings(config, model, train_src), train_src.starts))
      x, starts = train[0]
      return aggregate.fragment_descriptors(x, starts, method=config.eval.aggregation,
                                            alpha=power)

    return Pipeline(config, patch_embeddings(config, model, src), src.starts, lbp_embeddings,
                    whitening_fit)

  def run(self, model, chosen=None, tune=False):
    config, e, src = self.config, self.config.eval, self.source
    pipeline = self.pipeline(model, src)
    labels = labelings(src)
    embedded = {'encoder': (pipeline.descriptors(e.power), 'euclidean')}
    if pipeline.lbp is not None:
      embedded['srs_lbp'] = (pipeline.lbp, 'cityblock')
    scores, details = {}, {}
    for method, (emb, metric) in embedded.items():
      scores[method] = metrics.retrieval_metrics(emb, labels, metric=metric, per_query=True)
      ap = {labeling: block.pop('ap') for labeling, block in scores[method].items()}
      ranks = {labeling: block.pop('ranks') for labeling, block in scores[method].items()}
      details[method] = dict(embeddings=emb, metric=metric, ap=ap, ranks=ranks)

    settings, matrices = {}, {}
    plain = {**configured_settings(config), 'whitening_dims': 0, 'rerank_k': 0,
             'fusion_weight': 0.0}
    if configured_settings(config) != plain:
      settings['configured'] = configured_settings(config)
    if tune:
      chosen, scores['tuning'] = choose_settings(pipeline, labels)
      chosen = dict(chosen, chosen_on=e.tune_split)
    if chosen:
      settings['tuned'] = {name: chosen[name] for name in SETTINGS}
      scores['tuned_settings'] = chosen
    for method, s in settings.items():
      matrices[method] = pipeline.distances(s)
      scores[method] = metrics.metrics_from_distances(matrices[method], labels)
    scores['score'] = scores[self.headline_method(scores)]['writer']['map']
    if e.export_distances and jax.process_index() == 0:
      # retrieval/fragments/validate.py's scored_methods: the method is one of these.
      if e.export_method in matrices:
        d = matrices[e.export_method]
      elif e.export_method in embedded:
        d = metrics.distance_matrix(*embedded[e.export_method])
      else:
        raise errors.UserError(
            f"eval.export_method={e.export_method!r}: nothing was chosen for split "
            f"{self.split!r}; evaluate eval.tune_split={e.tune_split!r}'s entry in the same "
            'run (launch.evaluate without --evals, or naming it too)')
      self._export(d)
    return scores, details

  def _export(self, distances):
    eval_dir = files.join(self.workdir, 'eval')
    files.save_npy(files.join(eval_dir, f'distances_{self.split}.npy'), distances)
    distances_io.write_distance_csv(files.join(eval_dir, f'distances_{self.split}.csv'),
                                    distances, self.source.names,
                                    header=self.config.eval.export_csv_header)

  def headline_method(self, scores):
    return next(m for m in ('tuned', 'configured', 'encoder') if m in scores)

  def headline(self, scores):
    return f"writer mAP {scores['score']:.4f} of method {self.headline_method(scores)!r}"

  def summary(self, scores):
    """(header, rows, note) of the headline scores, for the console: one row a method."""
    rows = [(method, b['writer']['map'], b['writer']['top1'], b['writer']['pr10'],
             b['writer']['pr100'], b['page']['map'], b['page']['top1'])
            for method, b in scores.items() if isinstance(b, dict) and 'writer' in b]
    chosen = ', '.join(f'{k} {v}' for k, v in scores.get('tuned_settings', {}).items()
                       if k != 'chosen_on')
    note = ('Writer retrieval, each fragment a query against all others: mAP, Top-1 (the '
            'nearest is by the same writer), Pr@10 / Pr@100 (precision of the nearest 10 / '
            '100); page: the same for the same page. encoder: the trained descriptor alone; '
            'srs_lbp: the organisers\' baseline; tuned: the post-processing the '
            f'{self.config.eval.tune_split!r} split chose ({chosen or "none"}).')
    return (('method', 'writer mAP', 'Top-1', 'Pr@10', 'Pr@100', 'page mAP', 'page Top-1'),
            rows, note)

  def report_sections(self, scores, details):
    return report.sections(self.split, scores, details, self.source, self.listing)
