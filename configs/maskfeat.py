"""MaskFeat pre-training of the fragment encoder's ViT trunk (retrieval/maskfeat/): masked
HOG prediction on fragment patches, no labels, then a fragment fine-tune that starts from it.

  # CPU demo, on make demo-fragments' data (pre-training, then the fine-tune from it):
  python -m launch.train --config configs/maskfeat.py:demo --data data/fragments-synth \
      --workdir workdirs/maskfeat-demo
  python -m launch.train --config configs/fragments.py:recipe=saghog --data data/fragments-synth \
      --workdir workdirs/saghog-demo --config.model.init_from=workdirs/maskfeat-demo
  # HisFrag20 at SAGHOG's scale (Peer et al. 2024), on accelerators:
  python -m launch.train --config configs/maskfeat.py:hisfrag20 --data /data/hisfrag20 \
      --workdir gs://bucket/maskfeat
  python -m launch.train --config configs/fragments.py:recipe=saghog,size=hisfrag20 --data /data/hisfrag20 \
      --workdir gs://bucket/saghog --config.model.init_from=gs://bucket/maskfeat

The trunk's settings (model.args, input.patch_size) must be the fine-tune's: the two configs
keep them equal (fragments.py reads vit_args from here).
"""
from bengrapheme import defaults

# The ViT trunks, shared with configs/fragments.py's saghog variants. SAGHOG's: 4x4
# sub-patches of a 32x32 patch (64 tokens), depth 8, width 512, 8 heads. The demo's: a
# quarter of the depth and width, a CPU step about as costly as the ResNet-20 demo's.
VIT_ARGS = {'hisfrag20': dict(patch=4, depth=8, width=512, heads=8, mlp_ratio=4.0,
                              dtype='bfloat16'),
            'demo': dict(patch=4, depth=4, width=128, heads=4, mlp_ratio=4.0, dtype='float32'),
            'test': dict(patch=4, depth=2, width=16, heads=2, mlp_ratio=2.0, dtype='float32')}


def vit_args(arg):
  return dict(VIT_ARGS[arg])


VARIANTS = ('demo', 'hisfrag20', 'test')


def fragment_test_size(c):
  """defaults.test_size for the tests' fragments (tests/conftest.py): 8 patches a fragment,
  2 of their 6 train writers held out as val."""
  defaults.test_size(c, steps=6)
  c.input.max_patches = 8
  c.data.val_writers = 0.34
  c.eval.batch_size = 64


def get_config(arg='demo'):
  arg = defaults.arguments(arg, 'configs/maskfeat.py', size=VARIANTS).size
  c = defaults.config()
  c.task = 'retrieval.maskfeat.task'
  # The fragment task's data and patches (retrieval/fragments/data.py): train/'s writers less the val
  # share pre-train (their labels unread); the val writers score the probe. 'collection'
  # pre-trains on any folder of images (no probe then: it has no labels).
  c.data.update(format='folder', val_writers=0.2, val_seed=0)
  c.input = dict(patch_size=32, max_patches=48, ink_bounds=(0.05, 0.6), num_threads=8)
  c.model = dict(name='vit', args=vit_args(arg), init_from='')
  # SAGHOG's: 75 % of the sub-patches masked; one 9-bin histogram per 4x4 sub-patch.
  c.maskfeat = dict(mask_ratio=0.75, hog_pool=4, hog_bins=9)
  # The fragment demo's mild jitter (slant and size identify writers).
  c.aug.update(affine=True, rotate_deg=3.0, scale=(0.95, 1.05), translate=0.05)
  c.train.update(steps=600, batch_size=256, lr=1e-3, warmup_steps=50, weight_decay=0.05,
                 log_every=25, checkpoint_every=100)
  # The probe's power (the evaluator's own setting, evals.val.power) is Peer et al.'s 0.4.
  c.evals = dict(val=dict(type='maskfeat', every=600))
  c.eval.update(batch_size=512)

  if arg == 'hisfrag20':
    # SAGHOG's pre-training (marco-peer/icdar24 config/maskfeat.yml): batches of 2,048
    # patches (64 pages x 32), AdamW lr 8e-4 with 5 % warm-up, weight decay 0.05; 200 of its
    # epochs (32 patches of each of ~100k fragments) are about 300,000 steps. Not run here.
    c.data.val_writers = 0.1
    c.input.max_patches = 128
    c.train.update(steps=300000, batch_size=2048, lr=8e-4, warmup_steps=15000,
                   log_every=100, checkpoint_every=2000)
    c.evals.val.every = 10000
    c.eval.batch_size = 4096
  elif arg == 'test':
    fragment_test_size(c)

  c.lock()
  return c
