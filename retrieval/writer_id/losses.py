"""Cross-entropy over the writers, per patch: a mean over independent rows, so gradient
accumulation keeps plain micro-batches."""
import jax.numpy as jnp
import optax

from retrieval.writer_id.model import logits


def loss(model, batch, key, config):
  del key  # no augmentation on the device
  out = logits(model, batch, config, train=True)
  loss = optax.softmax_cross_entropy_with_integer_labels(out, batch['label']).mean()
  return loss, {'accuracy': jnp.mean(jnp.argmax(out, -1) == batch['label'])}
