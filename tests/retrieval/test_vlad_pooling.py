"""NetVLAD / NetRVLAD pooling against its definition, written as loops in numpy: per cluster
k, V_k = sum over the map's vectors x of a_k(x) (x - c_k), a = softmax of the assignment
layer; each V_k L2-normalised when intra-normalised, then the whole vector, then the
projection and L2 (retrieval/fragments/model.py)."""
import numpy as np
import pytest
from flax import nnx

from configs import fragments
from retrieval.fragments import model


def unit(v):
  return v / (np.linalg.norm(v) + 1e-6)


@pytest.mark.parametrize('pooling, intra_norm', [('netvlad', True), ('netrvlad', False)])
def test_vlad_pooling_is_its_definition(pooling, intra_norm):
  config = fragments.get_config('test')
  config.model.update(pooling=pooling, vlad_intra_norm=intra_norm, netvlad_clusters=3)
  encoder = model.make_model(config, nnx.Rngs(0))
  size = config.input.patch_size
  x = np.random.default_rng(0).random((2, size, size, 1), np.float32)
  got = np.asarray(encoder(x))

  fmap = np.asarray(encoder.backbone(x, train=False), np.float64)
  w = np.asarray(encoder.assign.kernel[...], np.float64)
  b = np.asarray(encoder.assign.bias[...], np.float64)
  c = np.asarray(encoder.centres[...], np.float64)
  wp = np.asarray(encoder.projection.kernel[...], np.float64)
  bp = np.asarray(encoder.projection.bias[...], np.float64)
  for i in range(len(x)):
    vectors = fmap[i].reshape(-1, fmap.shape[-1])
    v = np.zeros_like(c)
    for xn in vectors:
      scores = xn @ w + b
      a = np.exp(scores - scores.max())
      a /= a.sum()
      for k in range(len(c)):
        v[k] += a[k] * (xn - c[k])
    if intra_norm:
      v = np.stack([unit(vk) for vk in v])
    expected = unit(unit(v.reshape(-1)) @ wp + bp)
    np.testing.assert_allclose(got[i], expected, rtol=2e-4, atol=2e-5)
