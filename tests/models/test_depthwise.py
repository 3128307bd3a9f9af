"""The EfficientNet's depthwise convolution on CPU (bengrapheme/models/depthwise.py, reached
through efficientnet._depthwise_conv) against its definition, lax.conv_general_dilated with
one group per channel: the output and the gradients with respect to input and kernel."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from bengrapheme.models import efficientnet, resnet

NHWC = ('NHWC', 'HWIO', 'NHWC')


def definition(x, w, strides, padding):
  return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=NHWC,
                                  feature_group_count=x.shape[-1],
                                  precision=lax.Precision.HIGHEST)


def model_conv(x, w, strides, padding):
  return efficientnet._depthwise_conv(x, w, strides, padding, dimension_numbers=NHWC,
                                      feature_group_count=x.shape[-1])


def output_and_grads(conv, x, w, strides, padding, cotangent):
  y, vjp = jax.vjp(lambda x, w: conv(x, w, strides, padding), x, w)
  return (y, *vjp(cotangent.astype(y.dtype)))


# The model's layers: strides 1 and 2, kernels 3 and 5, symmetric padding, on a map of several
# of depthwise.BLOCK's blocks a side, the last one partial; then a map smaller than the kernel,
# and SAME padding.
@pytest.mark.parametrize('shape, kernel, stride, padding', [
    *[((2, 19, 21, 6), k, s, 'symmetric') for k in (3, 5) for s in (1, 2)],
    ((2, 3, 2, 6), 5, 1, 'symmetric'), ((2, 3, 2, 6), 3, 2, 'same'),
    ((2, 19, 21, 6), 5, 2, 'same')])
@pytest.mark.slow
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_depthwise_conv_and_its_gradients_equal_the_grouped_convolution(shape, kernel, stride,
                                                                         padding, dtype):
  assert jax.default_backend() == 'cpu'  # the path under test
  rng = np.random.default_rng(kernel * 10 + stride)
  x = jnp.asarray(rng.normal(size=shape), dtype)
  w = jnp.asarray(rng.normal(size=(kernel, kernel, 1, shape[-1])), dtype)
  strides, pads = (stride, stride), resnet.conv_padding(kernel, stride, padding)
  out_shape = jax.eval_shape(lambda x, w: definition(x, w, strides, pads), x, w).shape
  cotangent = jnp.asarray(rng.normal(size=out_shape), dtype)
  ours = output_and_grads(jax.jit(model_conv, static_argnums=(2, 3)), x, w, strides, pads,
                          cotangent)
  # The definition in float32 on the very same (bfloat16-rounded) numbers.
  f32 = [a.astype(jnp.float32) for a in (x, w, cotangent)]
  expected = output_and_grads(definition, f32[0], f32[1], strides, pads, f32[2])
  # bfloat16 results are the float32 sums rounded once: within a unit in the last place.
  rtol = 1e-5 if dtype == 'float32' else 2 ** -8
  for name, a, b in zip(('output', 'input gradient', 'kernel gradient'), ours, expected):
    assert a.dtype == jnp.dtype(dtype) and a.shape == b.shape, name
    np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=rtol,
                               atol=rtol * float(jnp.abs(b).max()), err_msg=name)
