"""Closed-set writer identification on a HisFrag20 folder's train/ writers (retrieval/writer_id):
one page of each writer held out, the rest trains a classifier of patches.

  python -m launch.train --config configs/writer_id.py:demo --data data/fragments-synth \
      --workdir workdirs/writer-id
  python -m launch.evaluate --config configs/writer_id.py:demo --data data/fragments-synth \
      --workdir workdirs/writer-id
"""
from bengrapheme import defaults

VARIANTS = ('demo', 'test')


def get_config(arg='demo'):
  arg = defaults.arguments(arg, 'configs/writer_id.py', size=VARIANTS).size
  c = defaults.config()
  c.task = 'retrieval.writer_id.task'
  # The fragment task's folder and patch cache (retrieval/fragments/data.py) with no writer held out:
  # heldout_seed draws the held-out page of each writer.
  c.data.update(format='folder', val_writers=0.0, val_seed=0, heldout_seed=0)
  c.input = dict(patch_size=32, max_patches=48, ink_bounds=(0.05, 0.6), num_threads=8)
  c.model = dict(name='cifar_resnet', args=dict(depth=20, width=16, dtype='float32'),
                 num_writers=0, init_from='')
  c.train.update(steps=600, batch_size=256, lr=2e-3, warmup_steps=50, log_every=25,
                 checkpoint_every=100)
  c.evals = dict(val=dict(type='accuracy', every=600))
  c.eval.batch_size = 512
  if arg == 'test':
    defaults.test_size(c, steps=6)
    c.input.max_patches = 8
    c.model.args = dict(depth=8, width=4, dtype='float32')
    c.eval.batch_size = 64
  c.lock()
  return c
