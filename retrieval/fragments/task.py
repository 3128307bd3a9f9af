"""HisFrag20 fragment retrieval as the trainer sees it (config.task names this module).

Each piece lives in the file named for it: data (fragment cache, P x K batches), model (the
encoder), losses (metric-learning losses over the whole batch), evaluate (the evaluator: encoder vs SRS-LBP, distance
export); model.init_from_data fits NetRVLAD's centres before the first step. Retrieval has no
submission format, so there is no predictor.
"""
from retrieval.fragments.data import check_data, random_batch, train_data  # noqa: F401
from retrieval.fragments.evaluate import Evaluator  # noqa: F401
from retrieval.fragments.probe import KnnProbe  # noqa: F401
from retrieval.fragments.losses import batch_loss, embed, loss  # noqa: F401
from retrieval.fragments.model import init_from_data, make_model  # noqa: F401
from retrieval.fragments.validate import validate  # noqa: F401

EVALUATORS = {'fragments': Evaluator, 'knn_probe': KnnProbe}  # config.evals.NAME.type
