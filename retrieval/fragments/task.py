"""HisFrag20 fragment retrieval as the trainer sees it (config.task names this module).

Each piece lives in the file named for it: data (fragment cache, P x K batches), model (the
encoder), losses (metric-learning losses over the whole batch), evaluate (the evaluator: encoder vs SRS-LBP, distance
export); model.init_from_data fits NetRVLAD's centres before the first step. Retrieval has no
submission format, so there is no predictor.
"""
from retrieval.fragments.data import check_data, random_batch, train_data  # noqa: F401
from retrieval.fragments.evaluate import Evaluator  # noqa: F401
from retrieval.fragments.probe import KnnProbe, features  # noqa: F401
from retrieval.fragments.losses import batch_loss, embed, loss  # noqa: F401
from retrieval.fragments.model import init_from_data, make_model  # noqa: F401
from retrieval.fragments.validate import validate  # noqa: F401

EVALUATORS = {'fragments': Evaluator, 'knn_probe': KnnProbe}  # config.evals.NAME.type


def unscorable(config, names):
  """protocols.Labels: a collection has no writers, so no split of it can be scored."""
  if config.data.format != 'collection':
    return ''
  off = ' '.join(f'--config.evals.{n}.every=0' for n in names)
  return (f"config.evals {', '.join(names)}: data.format='collection' has no labels to "
          f'score; train without evaluations ({off}), or score on a labelled dataset (--data '
          'in the HisFrag20 layout)')


def init_from_advice(config):
  """protocols.FineTunes: the ViT recipe starts from MaskFeat's pre-training of its trunk (the
  variant of configs/maskfeat.py whose ViT is model.args)."""
  from configs import maskfeat  # pylint: disable=import-outside-toplevel (configs use tasks)
  args = config.model.args.to_dict()
  variant = next((v for v in maskfeat.VARIANTS if maskfeat.vit_args(v) == args), 'demo')
  both = '; `make demo-saghog` runs both' if variant == 'demo' else ''
  return ("for the ViT recipe, MaskFeat's pre-training: python -m launch.train --config "
          f'configs/maskfeat.py:{variant} --data DATA --workdir {config.model.init_from}{both}')
