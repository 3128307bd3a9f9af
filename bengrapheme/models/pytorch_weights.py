"""Published PyTorch weights (a torchvision or timm state_dict) -> a backbone's NNX variables.

`--config.model.init_from=PATH` starts training from them (train.init_state). PATH is
  *.safetensors  read here with numpy alone (timm's weights on the Hugging Face hub come so);
  anything else  a torch.save'd state_dict, read with torch.load(weights_only=True) (needs torch).
The backbone names its layers under each naming it supports (`Model.pytorch_namings()`, in
forward order); the file's naming is the one whose first layer it holds. Then per layer:
  conv [out, in / groups, kh, kw]  -> kernel [kh, kw, in / groups, out]
  1x1 conv of a squeeze-excite     -> Linear kernel [in, out]
  BatchNorm weight, bias, running_mean, running_var -> scale, bias, mean, var
The first conv's RGB weights are summed to one channel for grayscale input: a gray image
x fed as (x, x, x) gives the same activations, so the trunk's BatchNorm statistics stay
valid. The classifier (and num_batches_tracked) is dropped. Any other difference is an error
that names the first parameter that does not fit, with both shapes.
"""
import json
import os

import ml_dtypes
import numpy as np
from flax import nnx

from bengrapheme import errors


class MissingWeights(errors.UserError, FileNotFoundError):
  """model.init_from names a file that is not there."""


SAFETENSORS_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
                      'BF16': ml_dtypes.bfloat16, 'I64': np.int64, 'I32': np.int32,
                      'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}


def read(path):
  """{name: numpy array} of a state_dict file (.safetensors, or torch.save's format)."""
  if not os.path.exists(path):
    raise MissingWeights(f'model.init_from={path!r}: no such file (docs/pretrained-weights.md, '
                            '"Starting from pretrained weights", says where to get one)')
  if path.endswith('.safetensors'):
    return _read_safetensors(path)
  try:
    import torch
  except ImportError as e:
    raise ImportError(f'model.init_from={path!r} is a torch.save file: reading it needs '
                      'torch (pip install torch), or save the weights as .safetensors '
                      '(docs/pretrained-weights.md)') from e
  state = torch.load(path, map_location='cpu', weights_only=True)
  if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
    raise ValueError(f'model.init_from={path!r}: expected a state_dict (names -> tensors); '
                     'save model.state_dict(), not the model or a training checkpoint')
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def _read_safetensors(path):
  """The safetensors layout: u64 little-endian header size, a JSON header of
  {name: {dtype, shape, data_offsets}}, then the raw little-endian tensors."""
  with open(path, 'rb') as f:
    size = int.from_bytes(f.read(8), 'little')
    header = json.loads(f.read(size))
    data = f.read()
  tensors = {}
  for name, info in header.items():
    if name == '__metadata__':
      continue
    begin, end = info['data_offsets']
    dtype = np.dtype(SAFETENSORS_DTYPES[info['dtype']]).newbyteorder('<')
    tensors[name] = np.frombuffer(data[begin:end], dtype).reshape(info['shape'])
  return tensors


def _expected(module):
  """{PyTorch suffix: (PyTorch shape, NNX variable name, to-NNX conversion)} of one layer."""
  if isinstance(module, nnx.Conv):
    kh, kw, cin, cout = module.kernel.shape
    out = {'weight': ((cout, cin, kh, kw), 'kernel', lambda w: w.transpose(2, 3, 1, 0))}
  elif isinstance(module, nnx.Linear):  # a squeeze-excite's 1x1 conv
    cin, cout = module.kernel.shape
    out = {'weight': ((cout, cin, 1, 1), 'kernel', lambda w: w[:, :, 0, 0].T)}
  elif isinstance(module, nnx.BatchNorm):
    (c,) = module.scale.shape
    same = lambda w: w
    return {'weight': ((c,), 'scale', same), 'bias': ((c,), 'bias', same),
            'running_mean': ((c,), 'mean', same), 'running_var': ((c,), 'var', same)}
  else:
    raise TypeError(f'no PyTorch counterpart for a {type(module).__name__}')
  if module.bias is not None:
    out['bias'] = ((cout,), 'bias', lambda w: w)
  return out


def backbone_state(backbone, path, tensors=None):
  """The nnx.State of `backbone`'s variables converted from the state_dict at `path`, for
  nnx.update(backbone, state). `backbone` may be abstract (nnx.eval_shape): only its layer
  types and shapes are read. `tensors` ({name: array}) skips reading `path` again."""
  tensors = read(path) if tensors is None else tensors
  namings = backbone.pytorch_namings()
  first = {naming: f'{layers[0][0]}.weight' for naming, (layers, _) in namings.items()}
  found = [naming for naming, name in first.items() if name in tensors]
  if not found:
    raise ValueError(
        f'model.init_from={path!r} is not a state_dict of this backbone '
        f'({type(backbone).__module__}): it has no ' +
        ' or '.join(f'{name!r} ({naming} naming)' for naming, name in first.items()) +
        f'; its first parameter is {next(iter(tensors), None)!r}')
  layers, classifier = namings[found[0]]
  paths = {id(node): path for path, node in nnx.iter_graph(backbone)}
  used, flat = set(), {}
  for i, (prefix, module) in enumerate(layers):
    for suffix, (shape, variable, convert) in _expected(module).items():
      name = f'{prefix}.{suffix}'
      if name not in tensors:
        raise ValueError(f'model.init_from={path!r}: {name} {shape} is missing from the file '
                         f'({found[0]} naming)')
      value = tensors[name]
      if i == 0 and suffix == 'weight' and shape[1] == 1 and value.shape[1:] == (3, *shape[2:]):
        value = value.sum(1, keepdims=True)  # RGB -> grayscale (module doc)
      if tuple(value.shape) != shape:
        raise ValueError(f'model.init_from={path!r}: {name} has shape {tuple(value.shape)}, the '
                         f'model expects {shape} (in PyTorch layout)')
      used.add(name)
      flat[(*paths[id(module)], variable)] = (
          type(getattr(module, variable)), convert(np.asarray(value, np.float32)))
  for name, value in tensors.items():
    if name not in used and not name.startswith(classifier) and not name.endswith(
        'num_batches_tracked'):
      raise ValueError(f'model.init_from={path!r}: {name} {tuple(value.shape)} has no place in '
                       f'the model ({found[0]} naming): a different architecture or size?')
  return _state(flat)


def _state(flat):
  nested = {}
  for path, (variable_type, value) in flat.items():
    d = nested
    for key in path[:-1]:
      d = d.setdefault(key, {})
    d[path[-1]] = variable_type(value)
  return nnx.State(nested)
