"""The writer classifier: a backbone (bengrapheme/models, by model.name) over a patch, its
feature map averaged, one linear layer to the writers' logits."""
from flax import nnx

from bengrapheme import errors, models
from retrieval.fragments.model import preprocess
from retrieval.writer_id import data


class WriterClassifier(nnx.Module):

  def __init__(self, config, rngs, num_writers):
    m = config.model
    self.backbone = models.backbone(m.name, in_channels=1, pool='none', rngs=rngs, **m.args)
    self.head = nnx.Linear(self.backbone.features, num_writers, rngs=rngs)

  def __call__(self, images, train=False):
    """images: float [B, S, S, 1] (preprocess) -> logits [B, writers]."""
    return self.head(self.backbone(images, train=train).mean(axis=(1, 2)))


def make_model(config, rngs):
  """model.num_writers classes, or with 0 one per writer of train/ (which needs --data)."""
  if not config.model.num_writers and not config.data.dir:
    raise errors.ConfigError('model.num_writers=0: the classes are counted from train/\'s '
                             'writers; pass --data, or set it (a dry run without data)')
  n = config.model.num_writers or len(data.writers(config))
  return WriterClassifier(config, rngs, n)


def logits(model, batch, config, train):
  return model(preprocess(batch['image'], config), train=train)
