"""The config fields every task shares: the trainer's and the augmentation's defaults.

configs/*.py start from config() and update it. This module imports ml_collections only, so
reading a config does not import jax, Orbax or matplotlib (as big_vision's configs).
"""
import types

import ml_collections


def config():
  """The fields every task's config has; configs/*.py update them and add their own."""
  return ml_collections.ConfigDict(dict(
      task='',  # the task module, e.g. 'bengrapheme.grapheme.task'
      seed=0,
      # data.dir is the dataset as downloaded (may be read-only); --data sets it. Prepared
      # copies go to cache_dir ('' = WORKDIR/prepared). format names the reader ('tfds':
      # a TFDS build in tfds_dir).
      data=dict(dir='', cache_dir='', format='', tfds_dir=''),
      aug=augmentation(),
      train=dict(
          steps=1000, batch_size=128, lr=1e-3, warmup_steps=100, final_lr_fraction=0.01,
          weight_decay=0.05, grad_clip=1.0, ema_decay=0.0,
          # Any optax optimizer and schedule by name; the trainer passes lr, warmup_steps,
          # steps, final_lr_fraction and weight_decay to the arguments of theirs that take
          # them (train.optimizer, schema.schedule_fields), *_args any other.
          optimizer='adamw', optimizer_args={}, schedule='warmup_cosine_decay_schedule',
          schedule_args={},
          # Micro-batches per step. With BatchNorm each micro-batch is normalised by its own
          # statistics; a coupled loss (gradient caching) is refused then unless
          # per_chunk_batch_stats accepts that (docs/adding-a-task.md).
          grad_accum_steps=1, per_chunk_batch_stats=False,
          # Parameter groups, NAME=dict(pattern=..., lr_scale=..., frozen_steps=...): the
          # parameters whose path ('backbone/blocks/3/...') the regex pattern matches whole
          # (the first group that matches) learn at lr x lr_scale, and not at all for their
          # first frozen_steps steps (fine-tuning from model.init_from: the new heads learn
          # first; BatchNorm statistics still adapt to the data meanwhile).
          groups={},
          # rate below 1: layer-wise decay, block i of L (the number the regex block
          # captures) learns at lr x rate^(L - i), the stem (matching stem, neither block
          # nor top) at lr x rate^(L + 1), the rest at lr (train.scale_by_layer; ViT
          # fine-tuning).
          layer_decay=dict(rate=1.0, block=r'backbone/blocks/(\d+)/.*', stem='backbone/.*',
                           top='backbone/norm/.*'),
          # Weight decay skips vectors (norm scales, biases) and the parameters this regex
          # matches whole ('': none), e.g. 'backbone/(pos_embed|cls_token)'.
          no_decay='',
          skip_nonfinite=False, log_every=50, checkpoint_every=250, keep_checkpoints=3,
          # (first, last): write a jax.profiler trace of these steps to WORKDIR/profile.
          profile_steps=(0, 0)),
      # The evaluators, NAME=dict(type=..., split=NAME, every=0, **settings): see
      # bengrapheme/evaluators.py. eval holds the settings they share (an entry's own keys
      # override them); tune_split names the entry that chooses post-processing ('': none).
      evals={},
      eval=dict(batch_size=256, tune_split=''),
      mesh=dict(data=-1, fsdp=1),  # data=-1: all devices not used by fsdp
  ))


def arguments(arg, config_file, **choices):
  """A config's arguments, as big_vision's configs take them: 'size=demo,recipe=saghog' picks
  a value for each key of `choices` (a tuple of the allowed values, the default first); a
  bare word sets the first key ('test' = 'size=test'). Returns them as attributes."""
  first = next(iter(choices))
  picked = {key: allowed[0] for key, allowed in choices.items()}
  for part in filter(None, arg.split(',')):
    key, value = part.split('=', 1) if '=' in part else (first, part)
    if key not in choices:
      raise ValueError(f'{config_file}:{arg}: no argument {key!r}; expected '
                       f'{", ".join(choices)}')
    if value not in choices[key]:
      raise ValueError(f'{config_file}:{arg}: {key}={value!r}: expected one of '
                       f'{", ".join(choices[key])}')
    picked[key] = value
  return types.SimpleNamespace(**picked)


def test_size(c, steps):
  """The tests' size, which every config's test variant starts from: `steps` steps of 16
  examples, a checkpoint every 2 (all kept), no evaluation during training, 2 input threads."""
  c.train.update(steps=steps, batch_size=16, warmup_steps=2, log_every=2, checkpoint_every=2,
                 keep_checkpoints=10)
  for entry in c.evals.values():
    entry.every = 0
  c.input.num_threads = 2


def augmentation():
  """bengrapheme/augment.py's fields, every stage off: a task turns on what suits its images
  (configs/grapheme.py the Bengali.AI winners' geometry, GridMask and CutMix; the fragment
  configs a mild jitter)."""
  return ml_collections.ConfigDict(dict(
      affine=False,
      rotate_deg=0.0,
      shear_deg=0.0,
      scale=(1.0, 1.0),
      translate=0.0,
      cutout_prob=0.0,
      cutout_size=0.3,
      erase_prob=0.0,  # RandomErasing (the 10th place's choice over CutMix/MixUp)
      erase_area=(0.02, 0.33),
      grid_mask_prob=0.0,
      mixup_alpha=0.0,
      cutmix_alpha=0.0,
      mix_prob=0.0,  # the share of batches mixed by MixUp / CutMix, chosen by their alphas
  ))
