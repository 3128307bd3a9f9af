"""MaskFeat pre-training (retrieval/maskfeat/) and the SAGHOG fine-tune from it: HOG targets,
masks, layer-wise decay, NetRVLAD's k-means centres, and a fine-tune that starts from the
pre-trained trunk."""
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from bengrapheme import checkpoint, parallel, train
from configs import fragments, maskfeat
from conftest import run_module, trained_and_evaluated
from retrieval.maskfeat import hog, losses
from models.test_finetune import updates
from test_probe import average_precision


def hog_by_definition(image, patch, pool, bins):
  """hog.targets for one image, pixel by pixel (reflect padding, Sobel as cross-correlation,
  floor(atan2(gx, gy) / pi * bins) mod bins, L2 per cell, cells in row-major order per token)."""
  h, w = image.shape
  x = np.pad(image.astype(np.float64), 1, mode='reflect')
  k = hog.SOBEL_X.astype(np.float64)
  cells = np.zeros((h // pool, w // pool, bins))
  for i in range(h):
    for j in range(w):
      window = x[i:i + 3, j:j + 3]
      # Exact arithmetic's zero where the sides cancel (a reflected border), not rounding's.
      gx, gy = [0.0 if abs(g) < 1e-9 else g for g in ((window * k).sum(), (window * k.T).sum())]
      b = math.floor(math.atan2(gx, gy) / math.pi * bins) % bins
      cells[i // pool, j // pool, b] += math.hypot(gx, gy)
  cells /= np.maximum(np.linalg.norm(cells, axis=-1, keepdims=True), 1e-12)
  per = patch // pool
  tokens = []
  for ti in range(h // patch):
    for tj in range(w // patch):
      tokens.append(cells[ti * per:(ti + 1) * per, tj * per:(tj + 1) * per].reshape(-1))
  return np.stack(tokens)


@pytest.mark.parametrize('patch,pool', [(4, 4), (8, 4)])
def test_hog_targets_equal_the_definition(patch, pool):
  rng = np.random.default_rng(0)
  images = (rng.random((2, 16, 24)) > 0.6).astype(np.float32) * rng.random((2, 16, 24))
  got = np.asarray(hog.targets(jnp.asarray(images), patch=patch, pool=pool, bins=9))
  assert got.shape == (2, (16 // patch) * (24 // patch), hog.dims(patch, pool, 9))
  for image, row in zip(images, got):
    np.testing.assert_allclose(row, hog_by_definition(image, patch, pool, 9), atol=1e-5)


def test_hog_of_a_vertical_edge_is_one_bin():
  image = np.zeros((1, 8, 8), np.float32)
  image[:, :, 4:] = 1.0  # ink on the right half: a horizontal gradient only
  cells = np.asarray(hog.targets(jnp.asarray(image), patch=4, pool=4, bins=9))[0]
  edge = cells[[1, 3]]  # the tokens whose cells hold the edge (columns 3-4)
  assert np.allclose(np.sort(edge, axis=1)[:, :-1], 0) and np.allclose(edge.max(1), 1)
  assert len(set(edge.argmax(1))) == 1


def test_random_mask_masks_exactly_the_ratio_and_differs_by_row():
  mask = np.asarray(losses.random_mask(jax.random.key(0), 32, 64, 0.75))
  assert mask.dtype == bool and (mask.sum(1) == 48).all()
  assert len({row.tobytes() for row in mask}) == 32


def test_layer_decay_scales_each_blocks_update():
  config = fragments.get_config('recipe=saghog,size=test')
  config.unlock()
  from retrieval.fragments import task
  shapes = nnx.state(nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0))), nnx.Param)
  params = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
  config.train.layer_decay.rate = 1.0
  plain = updates(config, params, steps=3)
  config.train.layer_decay.rate = 0.5
  decayed = updates(config, params, steps=3)
  depth = config.model.args.depth
  expected = {('patch_embed',): 0.5 ** (depth + 1), ('norm',): 1.0,
              **{('blocks', i): 0.5 ** (depth - i) for i in range(depth)}}
  for p, d in zip(plain[1:], decayed[1:]):  # step 1: the warm-up's zero learning rate
    for key, factor in expected.items():
      a, b = p['backbone'], d['backbone']
      for k in key:
        a, b = a[k], b[k]
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(y, factor * x, rtol=1e-6, atol=1e-12, err_msg=str(key))
    for name in ('assign', 'centres', 'projection'):
      for x, y in zip(jax.tree.leaves(p[name]), jax.tree.leaves(d[name])):
        np.testing.assert_allclose(y, x, rtol=1e-6, err_msg=name)


@pytest.fixture(scope='module')
def pretrained(fragment_data, tmp_path_factory):
  """configs/maskfeat.py:test trained 6 steps and evaluated by launch.evaluate."""
  return trained_and_evaluated('configs/maskfeat.py:test', fragment_data,
                               str(tmp_path_factory.mktemp('maskfeat') / 'workdir'))


@pytest.mark.slow
def test_pretraining_evaluates_reconstruction_and_the_writer_probe(pretrained, fragment_data):
  """metrics.json's probe mAP equals one computed here from the trunk (mean token, summed
  over a fragment's patches, power 0.4, L2, every other fragment ranked); the masked HOG
  error of the 6 trained steps is below that of the same model untrained."""
  from bengrapheme import restored, evaluators
  from retrieval.fragments import data
  from retrieval.fragments.model import preprocess
  with open(os.path.join(pretrained, 'eval', 'metrics.json')) as f:
    val = json.load(f)['val']
  config = maskfeat.get_config('test')
  config.data.dir = fragment_data
  task, model = restored.trained_model(config, pretrained)
  src = data.source(config, pretrained, 'val')
  params, model_state = model.variables
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0))))
  trunk = nnx.merge(graphdef, params, model_state).backbone
  tokens = np.asarray(trunk(preprocess(src.patches()[:len(src), :, :, None], config)),
                      np.float64)
  features = tokens.reshape(len(src), -1, tokens.shape[-1]).mean(1)
  sums = np.stack([features[a:b].sum(0) for a, b in zip(src.starts[:-1], src.starts[1:])])
  powered = np.sign(sums) * np.abs(sums) ** 0.4  # the probe's own setting (its SETTINGS)
  descriptors = powered / np.linalg.norm(powered, axis=1, keepdims=True)
  distances = ((descriptors[:, None] - descriptors[None]) ** 2).sum(-1)
  assert val['score'] == val['probe/writer/map']
  np.testing.assert_allclose(val['probe/writer/map'],
                             average_precision(distances, src.writer_ids), rtol=1e-5)
  np.testing.assert_allclose(val['probe/page/map'],
                             average_precision(distances, src.page_ids), rtol=1e-5)

  evaluator = evaluators.make(config, task, pretrained, ['val'])['val']
  graphdef, untrained = train.init_state(config, task, model.mesh, pretrained=False)
  untrained_scores, _ = evaluator.run(train.trained_model(graphdef, untrained, model.mesh, 0))
  assert 0 < val['reconstruction/loss'] < untrained_scores['reconstruction']['loss']


def finetune_config(init_from, **args):
  config = fragments.get_config('recipe=saghog,size=test')
  config.unlock()
  config.model.init_from = init_from
  config.model.args.update(args)
  return config


@pytest.mark.slow
def test_finetune_starts_from_the_pretrained_trunk(pretrained, fragment_data, tmp_path):
  config = finetune_config(pretrained)
  config.data.dir = fragment_data
  from retrieval.fragments import task
  mesh = parallel.make_mesh(config.mesh)
  graphdef, state = train.init_state(config, task, mesh)
  saved = ocp.StandardCheckpointer().restore(
      os.path.join(pretrained, 'checkpoints', str(checkpoint.newest_step(pretrained)), 'state'))
  got = nnx.State(state['params']['backbone']).to_pure_dict()
  want = jax.tree.map(np.asarray, saved['params']['backbone'])
  name = lambda path: '/'.join(str(k.key) for k in path)
  got_flat = {name(p): v for p, v in jax.tree_util.tree_flatten_with_path(got)[0]}
  want_flat = {name(p).removesuffix('/value'): v
               for p, v in jax.tree_util.tree_flatten_with_path(want)[0]}
  assert got_flat.keys() == want_flat.keys() and len(got_flat) > 10
  for key, value in want_flat.items():
    np.testing.assert_array_equal(np.asarray(got_flat[key]), value, err_msg=key)

  # NetRVLAD's centres: k-means of the trunk's token features, so each feature lies far
  # nearer its centre than the random initial centres.
  random_centres = np.asarray(state['params']['centres'][...])
  state = task.init_from_data(config, str(tmp_path), graphdef, state, mesh)
  centres = np.asarray(state['params']['centres'][...])
  model = nnx.merge(graphdef, state['params'], state['model_state'])
  from retrieval.fragments import data
  src = data.source(config, str(tmp_path), 'train')
  tokens = np.asarray(model.backbone(jnp.asarray(src.patches()[:64][..., None], jnp.float32)
                                     / 255.0)).reshape(-1, centres.shape[1])
  nearest = lambda c: np.sqrt(((tokens[:, None] - c[None]) ** 2).sum(-1)).min(1).mean()
  assert nearest(centres) < 0.5 * nearest(random_centres)


def test_finetune_from_another_trunk_is_one_line(pretrained):
  config = finetune_config(pretrained, depth=3)
  from retrieval.fragments import task
  with pytest.raises(checkpoint.ModelMismatchError, match='holds another backbone.*blocks/2'):
    train.init_state(config, task, parallel.make_mesh(config.mesh))


@pytest.mark.slow
def test_finetune_cli_from_the_pretrained_workdir(pretrained, fragment_data, tmp_path):
  workdir = tmp_path / 'finetune'
  result = run_module('launch.train', '--config=configs/fragments.py:recipe=saghog,size=test', '--data',
                      fragment_data, '--workdir', workdir,
                      f'--config.model.init_from={pretrained}')
  assert 'NetRVLAD: k-means of' in result.stdout
  assert os.path.isdir(workdir / 'checkpoints' / '6')
