"""Fine-tuning from published weights: the backbone's own learning rate (a group of
train.groups: lr_scale, frozen_steps), and model.init_from through the trainer."""
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchvision
from flax import nnx

from bengrapheme import train
from bengrapheme.grapheme import task
from bengrapheme.models import pytorch_weights, resnet
from configs import grapheme
from conftest import run_module
from core.test_resume import assert_bitwise_equal, final_state, run_until


def updates(config, params, steps=4):
  """The optimizer's updates for the same random gradients at fixed parameters (Adam's
  moments depend on the gradients alone, so two optimizers differ only by their scaling)."""
  tx, _ = train.optimizer(config)
  update = jax.jit(tx.update)
  state = tx.init(params)
  rng = np.random.default_rng(0)
  out = []
  for _ in range(steps):
    grads = jax.tree.map(lambda p: rng.normal(0, 0.1, p.shape).astype(np.float32), params)
    u, state = update(grads, state, params)
    out.append(nnx.State(u).to_pure_dict())
  return out


@pytest.mark.slow
def test_backbone_learning_rate_is_scaled_and_frozen_first():
  config = grapheme.get_config('test')
  shapes = nnx.state(nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0))), nnx.Param)
  params = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
  plain = updates(config, params)
  config.train.groups = dict(backbone=dict(pattern='backbone/.*', lr_scale=0.25,
                                            frozen_steps=2))
  tuned = updates(config, params)
  # Step 1 is the warm-up's zero learning rate for everything; step 2 the heads' first; from
  # step 3 the backbone warms up over warmup_steps (2) of its own to its quarter rate.
  assert config.train.warmup_steps == 2
  for step, (p, t) in enumerate(zip(plain, tuned), 1):
    scale = 0.25 * min(max(step - 2, 0) / 2, 1.0)
    for name in p:
      factor = scale if name == 'backbone' else 1.0
      for a, b in zip(jax.tree.leaves(p[name]), jax.tree.leaves(t[name])):
        np.testing.assert_allclose(b, factor * a, rtol=1e-6, atol=1e-12,
                                   err_msg=f'step {step}, {name}')
    if step >= 2:
      assert all(np.abs(x).max() > 0 for x in jax.tree.leaves(t['heads']))


@pytest.mark.slow
def test_weight_decay_skips_vectors_and_what_no_decay_matches():
  """With zero gradients AdamW's update is the decay alone: on matrices and kernels, not on
  vectors, and not on the parameters train.no_decay names."""
  config = grapheme.get_config('test')
  config.train.update(weight_decay=0.5, warmup_steps=0)
  shapes = nnx.state(nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0))), nnx.Param)
  params = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), shapes)

  def decayed(config):
    tx, _ = train.optimizer(config)
    u, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    return {train.path_name(path): bool(np.abs(x).max() > 0)
            for path, x in jax.tree_util.tree_leaves_with_path(nnx.State(u).to_pure_dict())}

  plain = decayed(config)
  assert plain == {train.path_name(path): len(leaf.shape) > 1 for path, leaf in
                   jax.tree_util.tree_leaves_with_path(nnx.State(params).to_pure_dict())}
  config.train.no_decay = 'heads/.*'
  masked = decayed(config)
  assert masked == {name: d and not name.startswith('heads/') for name, d in plain.items()}
  assert any(masked.values()) and any(d for n, d in plain.items() if n.startswith('heads/'))


FINETUNE_CONFIG = '''
import ml_collections
from configs import grapheme


def get_config():
  c = grapheme.get_config('test')
  with c.unlocked():  # torchvision's layout at ResNet-10 depth: the test's size, a real file
    c.model.args = ml_collections.ConfigDict(dict(
        depth=10, width=64, stem='imagenet', padding='symmetric', dtype='float32'))
    c.model.init_from = {path!r}
    c.train.groups = dict(backbone=dict(pattern='backbone/.*', lr_scale=1.0, frozen_steps=0))
  return c
'''
STEPS = 8
# As tests/core/test_resume.py (EMA on), with the fine-tuning schedule: the backbone frozen for
# its first 2 steps, then at half the learning rate.
EXACT = ['--config.train.checkpoint_every=2', '--config.train.log_every=1',
         '--config.train.ema_decay=0.9', '--config.train.groups.backbone.lr_scale=0.5',
         '--config.train.groups.backbone.frozen_steps=2', f'--config.train.steps={STEPS}']


@pytest.mark.slow
def test_finetune_from_a_converted_file_trains_and_resumes_exactly(grapheme_data, tmp_path):
  torch.manual_seed(0)
  weights = str(tmp_path / 'resnet10.pth')
  tv = torchvision.models.resnet
  torch.save(tv.ResNet(tv.BasicBlock, [1, 1, 1, 1]).state_dict(), weights)  # 3-channel stem
  config = tmp_path / 'finetune.py'
  config.write_text(FINETUNE_CONFIG.format(path=weights))

  def args(workdir):
    return [f'--config={config}', '--data', grapheme_data, '--workdir', str(workdir), *EXACT]

  reference = tmp_path / 'uninterrupted'
  run_module('launch.train', *args(reference))
  workdir = tmp_path / 'killed'
  returncode, output = run_until(args(workdir), str(workdir), 5, signal.SIGKILL)
  assert returncode == -signal.SIGKILL, output
  result = run_module('launch.train', *args(workdir))
  assert 'Resumed from' in result.stdout
  assert_bitwise_equal(final_state(str(reference), STEPS), final_state(str(workdir), STEPS))

  # The run started from the file: after the 2 frozen steps the backbone's parameters are
  # the file's exactly (grayscale stem included); by the last step they have trained.
  shapes = nnx.eval_shape(lambda: resnet.Model(depth=10, width=64, stem='imagenet',
                                                padding='symmetric', rngs=nnx.Rngs(0)))
  expected = flat(pytorch_weights.backbone_state(shapes, weights).filter(nnx.Param))
  frozen = flat(final_state(str(reference), 2)['params']['backbone'])
  trained = flat(final_state(str(reference), STEPS)['params']['backbone'])
  assert frozen.keys() == trained.keys() == expected.keys()
  assert all(np.array_equal(frozen[k], expected[k]) for k in expected)
  assert not any(np.array_equal(trained[k], expected[k]) for k in expected)


def flat(tree):
  """{'stem_conv/kernel': array} of an nnx.State or a restored checkpoint's dict (which
  keeps each variable's value under 'value')."""
  tree = tree.to_pure_dict() if isinstance(tree, nnx.State) else tree
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = [str(getattr(k, 'key', k)) for k in path]
    out['/'.join(keys[:-1] if keys[-1] == 'value' else keys)] = np.asarray(x)
  return out
