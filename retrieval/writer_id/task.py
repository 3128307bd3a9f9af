"""Closed-set writer identification (config.task names this module; configs/writer_id.py):
which of train/'s writers wrote a fragment from a page never seen in training. Added through
the trainer's seams alone (docs/adding-a-task.md walks through it): data (the fragment
task's patch cache, split by page), model (backbone + linear head), losses (cross-entropy),
evaluate (patch and fragment accuracy), validate.
"""
from retrieval.writer_id.data import check_data, random_batch, train_data  # noqa: F401
from retrieval.writer_id.evaluate import Accuracy
from retrieval.writer_id.losses import loss  # noqa: F401
from retrieval.writer_id.model import make_model  # noqa: F401
from retrieval.writer_id.validate import validate  # noqa: F401

EVALUATORS = {'accuracy': Accuracy}  # config.evals.NAME.type
