"""The EfficientNet / SE-ResNeXt / ResNet backbones against their PyTorch references (timm,
torchvision): parameter counts, and the forward pass from a converted state_dict
(bengrapheme/models/pytorch_weights.py) equal to the PyTorch model's in eval mode."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timm
import torch
import torchvision
from flax import nnx
from safetensors.torch import save_file

from bengrapheme.models import efficientnet, pytorch_weights, resnet, se_resnext

# Even sizes, where PyTorch's symmetric padding and XLA's SAME differ at every strided layer.
IMAGES = np.random.default_rng(0).random((2, 1, 48, 80), dtype=np.float32)  # NCHW, grayscale


def abstract(module, **args):
  return nnx.eval_shape(lambda: module.Model(rngs=nnx.Rngs(0), **args))


def param_count(model):
  return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize('timm_name, module, args', [
    *[(f'efficientnet_{v}', efficientnet, dict(variant=v)) for v in efficientnet.VARIANTS],
    ('seresnext50_32x4d', se_resnext, dict(depth=50)),
    ('seresnext101_32x4d', se_resnext, dict(depth=101)),
    ('resnet50', resnet, dict(depth=50, stem='imagenet')),
])
@pytest.mark.slow
def test_parameter_counts_equal_timms(timm_name, module, args):
  # Grayscale, as both tasks use them (colour input: test_safetensors_colour_input...).
  with torch.device('meta'):  # shapes only, no initialisation
    reference = timm.create_model(timm_name, num_classes=0, in_chans=1)
  ours = abstract(module, in_channels=1, **args)
  assert param_count(ours) == sum(p.numel() for p in reference.parameters())
  assert ours.features == reference.num_features


def randomised(model, seed=0):
  """Random BatchNorm affine parameters and statistics (PyTorch initialises them to 1, 0,
  0, 1, which would hide a scale / mean / var mix-up); eval mode."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for m in model.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        m.weight.uniform_(0.5, 1.5, generator=g)
        m.bias.uniform_(-0.2, 0.2, generator=g)
        m.running_mean.uniform_(-0.2, 0.2, generator=g)
        m.running_var.uniform_(0.5, 1.5, generator=g)
  return model.eval()


def converted(module, path, **args):
  """The backbone built from the file alone: every variable comes from the conversion."""
  shapes = abstract(module, **args)
  return nnx.merge(nnx.graphdef(shapes), pytorch_weights.backbone_state(shapes, path))


def forward(model, images_nchw):
  graphdef, state = nnx.split(model)
  apply = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
  return np.asarray(apply(state, jnp.asarray(images_nchw.transpose(0, 2, 3, 1))))


def assert_same_features(ours, reference):
  """To 1e-4, relative to the largest feature (random ResNet features reach ~100s)."""
  with torch.no_grad():  # the grayscale image as (x, x, x): what summing the stem means
    expected = reference(torch.from_numpy(IMAGES).expand(-1, 3, -1, -1)).numpy()
  got = forward(ours, IMAGES)
  assert got.shape == expected.shape
  error = np.abs(got - expected).max() / max(1.0, np.abs(expected).max())
  assert error < 1e-4, f'max relative difference {error:.2e}'


def timm_case(name):
  torch.manual_seed(0)
  model = randomised(timm.create_model(name, num_classes=10))
  return model, lambda x: model.forward_head(model.forward_features(x), pre_logits=True)


def torchvision_case(name):
  torch.manual_seed(0)
  model = randomised(getattr(torchvision.models, name)())
  if name.startswith('resnet'):
    trunk = torch.nn.Sequential(*list(model.children())[:-1], torch.nn.Flatten())
  else:
    trunk = torch.nn.Sequential(model.features, model.avgpool, torch.nn.Flatten())
  return model, trunk


@pytest.mark.parametrize('source, name, module, args', [
    ('timm', 'efficientnet_b0', efficientnet, dict(variant='b0')),
    ('torchvision', 'efficientnet_b2', efficientnet, dict(variant='b2')),
    ('timm', 'seresnext50_32x4d', se_resnext, dict(depth=50)),
    ('torchvision', 'resnet34', resnet,
     dict(depth=34, width=64, stem='imagenet', padding='symmetric')),
])
@pytest.mark.slow
def test_converted_forward_equals_pytorch(source, name, module, args, tmp_path):
  model, trunk = (timm_case if source == 'timm' else torchvision_case)(name)
  path = str(tmp_path / 'weights.pth')
  torch.save(model.state_dict(), path)  # the classifier included: the conversion drops it
  assert_same_features(converted(module, path, in_channels=1, **args), trunk)


@pytest.mark.slow
def test_safetensors_colour_input_and_bfloat16(tmp_path):
  model, trunk = timm_case('efficientnet_b0')
  path = str(tmp_path / 'model.safetensors')
  save_file(model.state_dict(), path)  # as timm's weights come from the Hugging Face hub
  tensors = pytorch_weights.read(path)
  assert set(tensors) == set(model.state_dict())
  ours = converted(efficientnet, path, variant='b0', in_channels=3)
  with torch.no_grad():
    x = np.random.default_rng(1).random((2, 3, 48, 80), dtype=np.float32)
    expected = trunk(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(forward(ours, x), expected, atol=1e-4)

  # bf16 compute, f32 parameters: the same weights, the same features to bf16 precision.
  half = converted(efficientnet, path, variant='b0', in_channels=3, dtype='bfloat16')
  assert {p.dtype for p in jax.tree.leaves(nnx.state(half, nnx.Param))} == {np.dtype('float32')}
  np.testing.assert_allclose(forward(half, x), expected, atol=0.1 * np.abs(expected).max())


@pytest.mark.parametrize('saved, loaded, message', [
    # Same names, different widths: the first layer in forward order that differs.
    ('efficientnet_b2', 'b0', r"blocks\.2\.0\.conv_pwl\.weight has shape \(48, 144, 1, 1\), "
                              r"the model expects \(40, 144, 1, 1\)"),
    # B1 = B0's widths, deeper: every B0 name fits, B1's extra blocks have no place.
    ('efficientnet_b1', 'b0', r"blocks\.0\.1\.conv_dw\.weight \(16, 1, 3, 3\) has no place"),
    # B0 file for a B1 model: the missing block.
    ('efficientnet_b0', 'b1', r"blocks\.0\.1\.conv_dw\.weight \(16, 1, 3, 3\) is missing"),
    # Another family altogether.
    ('resnet18', 'b0', r"no 'conv_stem\.weight' \(timm naming\) or 'features\.0\.0\.weight' "
                       r"\(torchvision naming\); its first parameter is 'conv1\.weight'"),
])
def test_a_mismatched_file_names_the_first_parameter_that_does_not_fit(saved, loaded, message,
                                                                         tmp_path):
  path = str(tmp_path / f'{saved}.pth')
  torch.save(timm.create_model(saved).state_dict(), path)
  with pytest.raises(ValueError, match=message):
    pytorch_weights.backbone_state(abstract(efficientnet, variant=loaded), path)


def test_unreadable_inputs_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='Starting from pretrained weights'):
    pytorch_weights.read(str(tmp_path / 'absent.pth'))
  path = str(tmp_path / 'whole_model.pth')
  torch.save({'state_dict': {'conv1.weight': torch.zeros(1)}, 'epoch': 3}, path)
  with pytest.raises(ValueError, match='expected a state_dict'):
    pytorch_weights.read(path)
  # A ResNet with the small stem has no torchvision counterpart for its first conv.
  torch.save(torchvision.models.resnet18().state_dict(), path)
  with pytest.raises(ValueError, match=r'conv1\.weight has shape \(64, 3, 7, 7\), the model '
                                       r'expects \(64, 1, 3, 3\)'):
    pytorch_weights.backbone_state(abstract(resnet, depth=18, stem='small'), path)
