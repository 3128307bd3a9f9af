"""MaskFeat pre-training of a fragment encoder's ViT trunk (config.task names this module;
configs/maskfeat.py): 75 % of each patch's sub-patches masked, their HOG predicted (Wei et
al. 2022; SAGHOG, Peer et al. 2024). A third task in a few files, through the trainer's
seams only: data (random batches of the fragment patch cache, no labels), model (ViT +
mask token + HOG head), losses (masked HOG error), evaluate (held-out error and a k-NN
writer probe). A fragment run starts from its trunk with model.init_from=WORKDIR.
"""
from retrieval.fragments.probe import features  # noqa: F401
from retrieval.fragments.task import unscorable  # noqa: F401
from retrieval.maskfeat.data import check_data, random_batch, train_data  # noqa: F401
from retrieval.maskfeat.evaluate import Evaluator  # noqa: F401
from retrieval.maskfeat.losses import loss  # noqa: F401
from retrieval.maskfeat.model import make_model  # noqa: F401
from retrieval.maskfeat.validate import validate  # noqa: F401

EVALUATORS = {'maskfeat': Evaluator}  # config.evals.NAME.type
