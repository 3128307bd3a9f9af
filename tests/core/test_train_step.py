"""train.make_train_step on tiny stand-in tasks: gradient accumulation (per-row and coupled
losses), EMA, skipped steps."""
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bengrapheme import defaults, parallel, train
from retrieval.fragments import losses


class Linear(nnx.Module):
  """The smallest protocols.Model: one dense layer as its backbone."""

  def __init__(self, config, rngs):
    del config
    self.backbone = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, x, train=False):
    del train
    return self.backbone(x)


def mean_squared_error(model, batch, key, config):
  del key, config
  loss = jnp.mean((model(batch['x']) - batch['y']) ** 2)
  return loss, {'mse': loss}


TASK = types.SimpleNamespace(make_model=Linear, loss=mean_squared_error)


def config(**train_fields):
  c = defaults.config()
  c.model = dict(init_from='')
  # No warm-up: the first step already moves the parameters. No clipping: it would hide a
  # gradient of the wrong scale (so would Adam, but not its moments in the state).
  c.train.update(steps=10, lr=0.01, warmup_steps=0, grad_clip=1e9, **train_fields)
  return c


def batch(size=16, seed=0):
  rng = np.random.default_rng(seed)
  return {'x': rng.normal(size=(size, 4)).astype(np.float32),
          'y': rng.normal(size=(size, 3)).astype(np.float32)}


def run(c, batches, task=TASK):
  """The states (as numpy) before and after each step, and each step's scalars."""
  mesh = parallel.make_mesh(c.mesh)
  graphdef, state = train.init_state(c, task, mesh)
  step = train.make_train_step(c, task, graphdef, mesh, jax.tree.map(lambda x: x.sharding, state))
  states, scalars = [jax.device_get(state)], []
  for b in batches:
    state, out = step(state, parallel.global_batch(mesh, b))  # donates the previous state
    states.append(jax.device_get(state))
    scalars.append(jax.device_get(out))
  return states, scalars


def assert_trees_close(a, b, **tolerance):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, **tolerance)


def assert_accumulation_exact(make_config, batches, task, scalar_keys):
  """Steps with 4 micro-batches end where steps on the whole batches do; returns the latter's
  scalars."""
  one, one_scalars = run(make_config(grad_accum_steps=1), batches, task)
  accumulated, accumulated_scalars = run(make_config(grad_accum_steps=4), batches, task)
  assert not np.allclose(one[2]['params']['backbone']['kernel'],
                         one[0]['params']['backbone']['kernel'])
  assert_trees_close(accumulated[-1], one[-1], rtol=1e-5, atol=1e-7)
  for a, b in zip(accumulated_scalars, one_scalars):
    for key in scalar_keys:
      np.testing.assert_allclose(a[key], b[key], rtol=1e-5)
  return one_scalars


def test_accumulated_micro_batches_equal_one_batch_k_times_the_size():
  batches = [batch(seed=0), batch(seed=1)]  # two steps: Adam's second moment takes part
  assert_accumulation_exact(config, batches, TASK, ('loss', 'mse', 'grad_norm'))


def embed(model, batch, key, config):
  del key, config
  out = model(batch['x'])
  return out / jnp.linalg.norm(out, axis=-1, keepdims=True)


# A P x K metric-learning task: multi-similarity couples every row with every other one.
COUPLED = types.SimpleNamespace(
    make_model=Linear, embed=embed, batch_loss=losses.batch_loss,
    loss=lambda model, batch, key, config: losses.batch_loss(
        embed(model, batch, key, config), batch, config))


def p_by_k_batch(p=4, k=4, seed=0):
  """P writers of K rows each, a writer's rows adjacent (as retrieval/fragments/data.py draws them)."""
  rng = np.random.default_rng(seed)
  return {'x': rng.normal(size=(p * k, 4)).astype(np.float32),
          'label': np.repeat(np.arange(p, dtype=np.int32), k)}


def coupled_config(**train_fields):
  c = config(**train_fields)
  c.loss = dict(name='multi_similarity',
                multi_similarity=dict(alpha=2.0, beta=50.0, lam=0.5, epsilon=0.1))
  return c


def test_accumulating_a_coupled_loss_equals_the_full_batch_step():
  """K = 4 and 4 micro-batches: split by rows, each would hold one patch per writer and no
  positive pair (a zero loss); gradient caching computes the loss on the whole batch."""
  batches = [p_by_k_batch(seed=0), p_by_k_batch(seed=1)]
  one_scalars = assert_accumulation_exact(coupled_config, batches, COUPLED,
                                          ('loss', 'similarity_gap', 'grad_norm'))
  assert float(one_scalars[0]['loss']) > 0.1


def test_ema_is_decay_times_ema_plus_the_rest_times_the_new_params():
  decay = 0.9
  states, _ = run(config(ema_decay=decay), [batch(seed=0), batch(seed=1)])
  for old, new in zip(states, states[1:]):
    expected = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, old['ema'], new['params'])
    assert_trees_close(new['ema'], expected, rtol=1e-6)
  # After two steps the average lags the parameters: the check above compared distinct trees.
  assert not np.allclose(states[2]['ema']['backbone']['kernel'],
                         states[2]['params']['backbone']['kernel'])


def test_a_non_finite_step_is_skipped_and_counted():
  poisoned = batch(seed=1)
  poisoned['x'][3, 2] = np.nan
  states, scalars = run(config(skip_nonfinite=True, ema_decay=0.9),
                        [batch(seed=0), poisoned, batch(seed=2)])
  before, skipped, after = states[1], states[2], states[3]
  assert [int(s['nonfinite']) for s in scalars] == [0, 1, 0]
  assert [int(s['step']) for s in states] == [0, 1, 2, 3]  # the counter still moves on
  for key in ('params', 'opt_state', 'ema', 'model_state'):
    jax.tree.map(np.testing.assert_array_equal, skipped[key], before[key])
  assert int(skipped['first_nonfinite_step']) == 2 == int(after['first_nonfinite_step'])
  # The next good step trains on from the kept state.
  assert not np.allclose(after['params']['backbone']['kernel'], before['params']['backbone']['kernel'])
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))
