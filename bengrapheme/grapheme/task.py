"""Bengali.AI grapheme classification as the trainer sees it (config.task names this module).

Each piece lives in the file named for it: data (Kaggle folder or TFDS build -> grain),
model (backbone + component heads, preprocessing), losses, evaluate (the evaluator, and the
Kaggle submission that launch.predict writes).
"""
from bengrapheme.grapheme.data import check_data, random_batch, train_data  # noqa: F401
from bengrapheme.grapheme.evaluate import Evaluator, predict  # noqa: F401
from bengrapheme.grapheme.losses import loss  # noqa: F401
from bengrapheme.grapheme.model import make_model  # noqa: F401
from bengrapheme.grapheme.validate import validate  # noqa: F401

EVALUATORS = {'grapheme': Evaluator}  # config.evals.NAME.type
