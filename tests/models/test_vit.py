"""The ViT backbone (bengrapheme/models/vit.py) against timm's VisionTransformer: parameter
counts, and the forward pass with timm's weights copied in equal to timm's in eval mode; the
token map, bf16 compute and the config lookup."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models.vision_transformer import VisionTransformer

from bengrapheme import models
from bengrapheme.models import vit
from configs import fragments
from retrieval.fragments import model as retrieval_model

SMALL = dict(patch=4, depth=2, width=64, heads=4, mlp_ratio=4.0)
SAGHOG = dict(patch=4, depth=8, width=512, heads=8)
# NCHW grayscale; not square, so a height / width mix-up in the token order, the position
# table or the token map shows.
IMAGES = np.random.default_rng(0).random((2, 1, 32, 48), dtype=np.float32)


def timm_vit(patch, depth, width, heads, mlp_ratio=4.0, *, position, class_token, pool,
             image_size=(32, 48)):
  """timm's counterpart: pool='avg' is global_pool='avg' with the final norm on the tokens
  (fc_norm=False); the sine-cosine table goes into pos_embed, which then skips the class
  token (no_embed_class), as in MAE."""
  return VisionTransformer(
      img_size=image_size, patch_size=patch, in_chans=1, num_classes=0, embed_dim=width,
      depth=depth, num_heads=heads, mlp_ratio=mlp_ratio, class_token=class_token,
      global_pool='token' if pool == 'token' else 'avg', fc_norm=False,
      no_embed_class=position == 'sincos')


def mae_sincos(grid, dim):
  """MAE's table [sin x, cos x, sin y, cos y] from timm's own [sin y, sin x, cos y, cos x]."""
  table = build_sincos2d_pos_embed(list(grid), dim).numpy()
  sin_y, sin_x, cos_y, cos_x = np.split(table, 4, axis=1)
  return np.concatenate([sin_x, cos_x, sin_y, cos_y], axis=1)


def param_count(model):
  return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize('position, class_token', [
    ('sincos', False), ('learnt', False), ('learnt', True)])
def test_saghog_parameter_count_equals_timms(position, class_token):
  ours = nnx.eval_shape(lambda: vit.Model(**SAGHOG, position=position, class_token=class_token,
                                          image_size=32, rngs=nnx.Rngs(0)))
  with torch.device('meta'):  # shapes only
    reference = VisionTransformer(
        img_size=32, patch_size=4, in_chans=1, num_classes=0, embed_dim=512, depth=8,
        num_heads=8, class_token=class_token, global_pool='avg', fc_norm=False,
        pos_embed='learn' if position == 'learnt' else 'none')
  assert param_count(ours) == sum(p.numel() for p in reference.parameters())
  assert ours.features == reference.num_features == 512


def randomised(model, seed=0):
  """Every parameter random: timm's zero biases and unit LayerNorm scales would hide a mix-up,
  and its 0.02-std weights would leave the attention uniform (any q/k bug unseen). Linear
  weights at 1.5 / sqrt(fan_in) give attention logits of std ~2 at width 64."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('weight') and p.ndim > 1:
        p.normal_(0, 1.5 / np.sqrt(np.prod(p.shape[1:])), generator=g)
      elif name.endswith('weight'):  # LayerNorm
        p.uniform_(0.5, 1.5, generator=g)
      else:  # biases, class token, position embedding
        p.normal_(0, 0.3, generator=g)
  return model.eval()


def copy_timm_weights(ours, reference, unused=()):
  """timm's state_dict -> our parameters: Linear weight [out, in] -> kernel [in, out], patch
  conv [out, in, kh, kw] -> [kh, kw, in, out], LayerNorm weight -> scale. Every parameter of
  ours is set and every one of timm's used, bar `unused`."""
  tensors = {k: v.numpy() for k, v in reference.state_dict().items()}
  flat = []
  for path, variable in nnx.to_flat_state(nnx.state(ours, nnx.Param)):
    name = '.'.join(map(str, path)).replace('patch_embed.', 'patch_embed.proj.')
    name = name.replace('.kernel', '.weight').replace('.scale', '.weight')
    value = tensors.pop(name)
    if path[-1] == 'kernel':
      value = value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
    assert value.shape == variable.shape, name
    flat.append((path, variable.replace(jnp.asarray(value))))
  assert set(tensors) == set(unused)
  nnx.update(ours, nnx.from_flat_state(flat))
  return ours


def forward(model, images_nchw):
  graphdef, state = nnx.split(model)
  apply = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
  return np.asarray(apply(state, jnp.asarray(images_nchw.transpose(0, 2, 3, 1))))


def assert_close(got, expected):
  """To 1e-4, relative to the largest value (float32, as the other backbone tests)."""
  assert got.shape == expected.shape
  error = np.abs(got - expected).max() / max(1.0, np.abs(expected).max())
  assert error < 1e-4, f'max relative difference {error:.2e}'


@pytest.mark.parametrize('position, class_token, pool', [
    ('learnt', False, 'avg'),
    ('learnt', True, 'token'),
    ('sincos', True, 'avg'),
])
@pytest.mark.slow
def test_forward_and_token_map_equal_timms(position, class_token, pool):
  torch.manual_seed(0)
  reference = randomised(timm_vit(**SMALL, position=position, class_token=class_token,
                                  pool=pool))
  grid = (IMAGES.shape[2] // 4, IMAGES.shape[3] // 4)
  if position == 'sincos':
    with torch.no_grad():
      reference.pos_embed.copy_(torch.from_numpy(mae_sincos(grid, SMALL['width']))[None])
  with torch.no_grad():
    tokens = reference.forward_features(torch.from_numpy(IMAGES))
    expected = reference.forward_head(tokens, pre_logits=True).numpy()
  # Patch tokens only, the class token left out, in row-major order.
  expected_map = tokens[:, 1 if class_token else 0:].reshape(2, *grid, -1).numpy()

  unused = ('pos_embed',) if position == 'sincos' else ()
  args = dict(SMALL, position=position, class_token=class_token, image_size=(32, 48))
  ours = copy_timm_weights(vit.Model(**args, pool=pool, rngs=nnx.Rngs(0)), reference, unused)
  assert param_count(ours) == sum(p.numel() for p in reference.parameters()) - sum(
      getattr(reference, n).numel() for n in unused)
  assert_close(forward(ours, IMAGES), expected)
  token_map = copy_timm_weights(vit.Model(**args, pool='none', rngs=nnx.Rngs(0)), reference,
                                unused)
  assert_close(forward(token_map, IMAGES), expected_map)


def test_sincos_table_is_maes():
  np.testing.assert_allclose(vit.sincos_table(8, 12, 64), mae_sincos((8, 12), 64), atol=1e-6)


@pytest.mark.parametrize('class_token', [False, True])
def test_token_map_of_the_saghog_configuration(class_token):
  model = nnx.eval_shape(lambda: models.backbone('vit', in_channels=1, pool='none',
                                                 class_token=class_token, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  out = jax.eval_shape(lambda s, x: nnx.merge(graphdef, s)(x), state,
                       jax.ShapeDtypeStruct((5, 32, 32, 1), jnp.float32))
  assert out.shape == (5, 8, 8, 512)  # 32x32 patches in 4x4 sub-patches; no class token
  assert model.features == 512 and len(model.blocks) == 8


def dtypes_into(jaxpr, primitives):
  """The operand dtypes of each `primitives` equation, inner jaxprs (jit, custom_jvp) too."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in primitives:
      found.append(tuple(v.aval.dtype for v in eqn.invars))
    for param in eqn.params.values():
      for sub in param if isinstance(param, tuple | list) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          found += dtypes_into(sub.jaxpr, primitives)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          found += dtypes_into(sub, primitives)
  return found


def test_bfloat16_computes_in_bfloat16_with_float32_parameters():
  f32 = vit.Model(**SMALL, pool='none', rngs=nnx.Rngs(0))
  bf16 = vit.Model(**SMALL, pool='none', dtype='bfloat16', rngs=nnx.Rngs(0))
  assert {p.dtype for p in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {np.dtype('float32')}
  graphdef, state = nnx.split(bf16)
  x = jnp.asarray(IMAGES.transpose(0, 2, 3, 1))
  jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, x).jaxpr
  matmuls = dtypes_into(jaxpr, ('dot_general', 'conv_general_dilated'))
  # The patch conv, then per block qkv, q.k, attention x v, proj, fc1, fc2.
  assert len(matmuls) == 1 + 6 * SMALL['depth']
  assert set(matmuls) == {(jnp.dtype('bfloat16'),) * 2}
  got = forward(bf16, IMAGES)
  assert got.dtype == jnp.bfloat16
  expected = forward(f32, IMAGES)  # the same initialisation
  np.testing.assert_allclose(got.astype(np.float32), expected, atol=0.1)
  pooled = vit.Model(**SMALL, dtype='bfloat16', rngs=nnx.Rngs(0))
  assert forward(pooled, IMAGES).dtype == np.float32  # pooled in float32, as the CNNs


@pytest.mark.parametrize('pooling', ['gem', 'netvlad'])
def test_config_lookup_and_the_retrieval_pooling_heads(pooling):
  model = models.backbone('vit', in_channels=1, rngs=nnx.Rngs(0), **SMALL)
  assert isinstance(model, vit.Model) and model.features == 64
  assert forward(model, IMAGES).shape == (2, 64)

  config = fragments.get_config('test')
  with config.unlocked():
    config.model.update(name='vit', pooling=pooling, args=dict(SMALL, dtype='float32'))
  encoder = retrieval_model.make_model(config, nnx.Rngs(0))
  assert isinstance(encoder.backbone, vit.Model) and encoder.backbone.pool == 'none'
  embeddings = forward(encoder, IMAGES[:, :, :32, :32])
  assert embeddings.shape == (2, config.model.embedding_dim)
  np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-4)


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match=r"model.pool='token' needs model.class_token=True"):
    vit.Model(**SMALL, pool='token', rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r'model.width=66: a 2-D sine-cosine'):
    vit.Model(**dict(SMALL, width=66, heads=2), rngs=nnx.Rngs(0))
  model = vit.Model(**SMALL, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r'a 30x32 input is not divisible into model.patch=4'):
    model(jnp.zeros((1, 30, 32, 1)))
  learnt = vit.Model(**SMALL, position='learnt', image_size=32, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r'8x12 patch grid; the learnt position embedding is '
                                       r'for 8x8 \(model.image_size\)'):
    learnt(jnp.zeros((1, 32, 48, 1)))


def test_masked_tokens_see_only_the_mask_token():
  """MaskFeat's input: a masked sub-patch's pixels never reach the trunk, its token is the
  mask token (before the position embedding), and unmasked ones are untouched."""
  model = vit.Model(patch=4, depth=2, width=32, heads=4, pool='none', rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.random((1, 16, 16, 1)), jnp.float32)
  changed = x.at[0, 4:8, 0:4].set(0.5)  # token 4 (row 1, column 0) of the 4 x 4 grid
  mask = jnp.zeros((1, 16), bool).at[0, 4].set(True)
  token = jnp.asarray(rng.normal(size=32), jnp.float32)
  np.testing.assert_array_equal(model(x, mask=mask, mask_token=token),
                                model(changed, mask=mask, mask_token=token))
  assert not np.allclose(model(x), model(changed))
  # Masking token 4 with the very embedding its pixels give changes nothing.
  own = model.patch_embed(x)[0, 1, 0]
  np.testing.assert_allclose(model(x, mask=mask, mask_token=own), model(x), atol=1e-6)
