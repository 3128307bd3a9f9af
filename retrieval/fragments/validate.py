"""The fragment task's config checks (protocols.Validates): run by train.load_task, so by every
entry point before the patch cache is built, each naming the field's path and what it
allows."""
from bengrapheme import errors, models
from retrieval.features import aggregate
from retrieval.fragments import losses, model

WHITENING = ('self', 'train')
LABELS = ('writer', 'surrogate')


def scored_methods(config):
  """The embedding methods the evaluator scores, so the ones eval.export_method may name."""
  e = config.eval
  methods = ['encoder', 'srs_lbp'] if e.srs_lbp else ['encoder']
  if e.whitening_dims or e.rerank_k or e.fusion_weight:
    methods.append('configured')
  if e.tune_split:
    methods.append('tuned')
  return methods


def check_data_fields(config):
  """What the fragment cache needs (MaskFeat pre-training reads the same folders)."""
  models.require(config)
  errors.require(config, 'data.format', ('folder', 'collection', 'tfds'))
  if config.data.format == 'tfds' and not config.data.tfds_dir:
    raise errors.ConfigError("data.format='tfds' needs data.tfds_dir, a TFDS data dir holding "
                             'a hisfrag20 build')


def validate(config):
  check_data_fields(config)
  losses.check_loss(config)
  errors.require(config, 'model.pooling', model.POOLINGS)
  errors.require(config, 'train.labels', LABELS)
  if config.data.format == 'collection' and config.train.labels != 'surrogate':
    raise errors.ConfigError(f"train.labels={config.train.labels!r}: data.format='collection' "
                             "has no writer labels; expected 'surrogate'")
  p = config.train.writers_per_batch
  if p < 1 or config.train.batch_size % p:
    raise errors.ConfigError(f'train.batch_size={config.train.batch_size}: expected a multiple '
                             f'of train.writers_per_batch={p} (P x K batches)')
  errors.require(config, 'eval.aggregation', aggregate.METHODS)
  errors.require(config, 'eval.whitening', WHITENING)
  if config.eval.export_distances and config.evals:
    errors.require(config, 'eval.export_method', scored_methods(config))
