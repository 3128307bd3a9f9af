"""The config fields every task shares: the trainer's and the augmentation's defaults.

configs/*.py start from config() and update it. This module imports ml_collections only, so
reading a config does not import jax, Orbax or matplotlib (as big_vision's configs).
"""
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
          weight_decay=0.05, grad_clip=1.0, ema_decay=0.0, grad_accum_steps=1,
          # Fine-tuning from model.init_from: the backbone's learning rate is lr x this, and
          # zero for its first backbone_frozen_steps steps (the new heads learn first; the
          # backbone's BatchNorm statistics still adapt to the data meanwhile).
          backbone_lr_scale=1.0, backbone_frozen_steps=0,
          # Below 1: layer-wise decay, backbone block i of L learns at lr x this^(L - i),
          # its stem at lr x this^(L + 1) (train.scale_by_layer; ViT fine-tuning).
          layer_decay=1.0,
          skip_nonfinite=False, log_every=50, checkpoint_every=250, keep_checkpoints=3,
          # (first, last): write a jax.profiler trace of these steps to WORKDIR/profile.
          profile_steps=(0, 0)),
      # every: evaluate config.eval.splits every this many steps during training (0: never).
      eval=dict(every=0, splits=('test',), batch_size=256),
      mesh=dict(data=-1, fsdp=1),  # data=-1: all devices not used by fsdp
  ))


def augmentation():
  """Defaults for grapheme images of about 128x128: mild geometry, GridMask and CutMix, the
  augmentations the Bengali.AI winners relied on."""
  return ml_collections.ConfigDict(dict(
      affine=True,
      rotate_deg=10.0,
      shear_deg=10.0,
      scale=(0.85, 1.15),
      translate=0.08,
      cutout_prob=0.0,
      cutout_size=0.3,
      erase_prob=0.0,  # RandomErasing (the 10th place's choice over CutMix/MixUp)
      erase_area=(0.02, 0.33),
      grid_mask_prob=0.3,
      mixup_alpha=0.0,
      cutmix_alpha=1.0,
      mix_prob=0.5,
  ))
