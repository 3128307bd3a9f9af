"""The root-letters term, pinned to its definition: the combined root log-probability is
log_softmax(root logits + each root's letter-pattern log-likelihood), and the loss adds
loss.terms.root_letters x the letters' binary cross-entropy, nothing else."""
import jax
import numpy as np
from flax import nnx
import pytest

from bengrapheme import defaults
from bengrapheme.grapheme import classes, kaggle, losses, model
from configs import grapheme as grapheme_config


def config(weight):
  c = grapheme_config.get_config('test')
  with c.unlocked():
    c.aug = defaults.augmentation()  # the batch as it is: targets are the one-hot labels
  c.model.update(root_letters=True, grapheme_head=False)
  c.loss.terms.root_letters = weight
  return c


def batch(size=6, seed=0):
  rng = np.random.default_rng(seed)
  labels = np.stack([rng.integers(0, n, size) for n in kaggle.NUM_CLASSES], 1).astype(np.int32)
  image = rng.integers(0, 256, (size, kaggle.HEIGHT, kaggle.WIDTH), np.uint8)
  return dict(image=image, labels=labels, grapheme=np.full(size, -1, np.int32))


def log_sigmoid(x):
  return -np.logaddexp(0, -x)


@pytest.mark.slow
def test_the_combined_root_is_the_head_plus_each_roots_letter_likelihood():
  net = model.make_model(config(0.1), nnx.Rngs(0))
  x = np.asarray(model.preprocess(batch()['image'], config(0.1)))
  out = jax.tree.map(np.asarray, net(x))
  features = net.backbone(x, train=False).astype(np.float32)
  head = np.asarray(net.heads[0](features), np.float64)
  letters = np.asarray(out['root_letters'], np.float64)
  patterns = np.array(classes.ROOT_LETTERS, np.float64)
  # A root's letters, each on or off: the sum over slots of log p(slot as the pattern says).
  pattern_ll = np.array([[sum(log_sigmoid(l[p]) if on else log_sigmoid(-l[p])
                              for p, on in enumerate(root)) for root in patterns]
                         for l in letters])
  pattern_ll -= np.log(np.exp(pattern_ll).sum(-1, keepdims=True))  # over the roots that exist
  scores = head + pattern_ll
  expected = scores - np.log(np.exp(scores).sum(-1, keepdims=True))
  np.testing.assert_allclose(out['grapheme_root'], expected, rtol=1e-4, atol=1e-4)


def test_the_loss_adds_the_weight_times_the_letters_bce():
  b, key = batch(), jax.random.key(0)
  net = model.make_model(config(0.0), nnx.Rngs(0))
  plain, aux = losses.loss(net, b, key, config(0.0))
  weighted, _ = losses.loss(net, b, key, config(0.25))
  logits = np.asarray(net(np.asarray(model.preprocess(b['image'], config(0.0))), train=True)
                      ['root_letters'], np.float64)
  targets = np.array(classes.ROOT_LETTERS, np.float64)[b['labels'][:, 0]]
  bce = -(targets * log_sigmoid(logits) + (1 - targets) * log_sigmoid(-logits)).sum(-1).mean()
  np.testing.assert_allclose(float(aux['ce_root_letters']), bce, rtol=1e-4)
  np.testing.assert_allclose(float(weighted) - float(plain), 0.25 * bce, rtol=1e-3)
