"""Bengali.AI grapheme classification (root / vowel diacritic / consonant diacritic).

Variants, each run with the trainer CLI:

  # CPU demo on synthetic data (make demo runs all of it):
  python -m bengrapheme.grapheme.synth --out data/bengali-synth --train 16000 --test 2000
  python -m launch.train --config configs/grapheme.py:demo --data data/bengali-synth \
      --workdir workdirs/grapheme-demo
  # The real competition files (Kaggle bengaliai-cv19), on accelerators, from ImageNet weights
  # (docs/pretrained-weights.md fetches the file model.init_from names):
  python -m launch.train --config configs/grapheme.py:kaggle --data /kaggle/input/bengaliai-cv19 \
      --workdir gs://bucket/grapheme-kaggle
  # Tiny, for the tests:
  python -m launch.train --config configs/grapheme.py:test --data DIR --workdir DIR
"""
from bengrapheme import defaults


VARIANTS = ('demo', 'kaggle', 'test')


def get_config(arg='demo'):
  arg = defaults.arguments(arg, 'configs/grapheme.py', size=VARIANTS).size
  c = defaults.config()  # the trainer's fields; what follows is this task's
  c.task = 'bengrapheme.grapheme.task'
  # data.dir: the Kaggle folder; format='tfds' reads bengrapheme/grapheme/tfds_bengaliai.py's
  # build in tfds_dir instead. The val split: the held-out graphemes' images plus a seeded
  # val_fraction of the other train.csv images (grapheme/data.py).
  # corrected_labels: train with the March 2020 update (train_multi_diacritics.csv: consonant
  # class 7, reph + ra-phala, in the 8 classes of class_map_corrected.csv); scores and
  # submission.csv stay in the competition's 7 classes (7 counts as 2).
  c.data.update(format='kaggle', val_fraction=0.02, corrected_labels=False)
  # Held out of everything training reads (grapheme/unseen.py), seeded apart from c.seed.
  c.unseen = dict(never_rendered=0.5, val_graphemes=0.05, seed=0)
  # Rendered graphemes (grapheme/rendered.py): `images` drawn once, `fraction` of each batch.
  # "family, R": chosen on the validation family (grapheme/synth_val.py) by record R-val-family
  # (experiments/results.md has what each was chosen among).
  # fraction: family, grapheme-nowhole-render0.5; images: family, grapheme-demo-now-images48k.
  c.render = dict(fraction=0.5, images=48000, workers=0)  # workers 0: all usable cores
  # (height, width) the model sees; crop_to_ink scales each grapheme's ink box to fill it.
  # stretch_contrast (family, grapheme-demo-stretch): each image's paper to 0, darkest ink to 1.
  c.input = dict(size=(56, 96), crop_to_ink=True, ink_threshold=0.25, stretch_contrast=True,
                 num_threads=8)
  c.model = dict(
      name='resnet',  # -> bengrapheme/models/resnet.py
      # CPU-sized: ResNet-10 at width 24 costs ~65 MFLOP per training image at 56x96.
      args=dict(depth=10, width=24, stem='imagenet', dtype='float32'),
      # The 1,295-way whole-grapheme head (seen vs unseen routing): off (family,
      # grapheme-hand-nowhole).
      grapheme_head=False,
      consonant_parts=True,  # the consonant diacritic from 4 part heads (grapheme/model.py)
      # The root also from its letters (family, grapheme-rootletters-w0.1): a head of 79
      # (position, letter) slots (model.py), their binary cross-entropy summed over the slots
      # and weighted (loss.terms.root_letters).
      root_letters=True,
      # A PyTorch state_dict (torchvision or timm names) for the backbone to start from
      # (bengrapheme/models/pytorch_weights.py; docs/pretrained-weights.md).
      init_from='')
  # The loss (grapheme/losses.py): the components' cross-entropies averaged with the
  # competition score's weights, plus each term whose head is on times its weight (a larger
  # root_letters weight takes the clipped gradient from the vowel and consonant heads).
  c.loss = dict(components=dict(grapheme_root=2.0, vowel_diacritic=1.0, consonant_diacritic=1.0),
                terms=dict(root_letters=0.1, grapheme=0.5))
  # Affine jitter only (family, grapheme-hand-affine).
  c.aug.update(affine=True, rotate_deg=10.0, shear_deg=10.0, scale=(0.85, 1.15),
               translate=0.08, cutmix_alpha=1.0)
  # steps: the demo's time budget (grapheme-demo-now-steps3400); lr: the sweep lr_tau's
  # choice on the validation family (get_sweeps below; record sweep-grapheme-lr_tau).
  c.train.update(steps=3400, batch_size=128, lr=0.03172320685147554, warmup_steps=100, log_every=50,
                 checkpoint_every=250)
  # val chooses the prediction rule's settings (eval.tune_split); test reports them as rule
  # 'chosen' beside the configured rule.
  c.evals = dict(val=dict(type='grapheme', every=1000), test=dict(type='grapheme', every=1000))
  c.eval.update(batch_size=256, tune_split='val')
  # A whole-grapheme prediction at least this confident overrides the component heads (2.0:
  # never; val's choice); tau: prior correction, the argmax of log p - tau * log(training
  # count), which would help the rare roots unseen graphemes bring: the sweep lr_tau's
  # choice on the validation family (record sweep-grapheme-lr_tau).
  # read: the test images straight from a Kaggle folder's parquet files, window_rows at a
  # time (0: a whole file; memory holds a window, 32 KB an image), or 'prepared' (converted
  # once to the training layout; bench/real_sizes.py measured both at full size).
  # tta_margins (family, grapheme-rootletters-w0.1-lr3.2e-2-tta2-4-8): test-time views, one
  # per crop margin around the ink in source pixels (grapheme/evaluate.py; empty: one view,
  # margin 4, as training crops).
  c.predict = dict(seen_threshold=2.0, tau=0.0, read='stream', window_rows=0,
                   tta_margins=(2, 4, 8))

  if arg == 'kaggle':
    # The full recipe at native resolution: an ImageNet-pretrained EfficientNet-B3 trunk (the
    # winners' family: 1st place B7/B0, 8th B1), bf16 compute, EMA. 45,000 steps of 256 are
    # ~48 epochs of the ~181k real training images (three quarters of each batch; the rest
    # rendered).
    c.data.update(val_fraction=0.05, corrected_labels=True)  # as the 1st place trained
    c.input.size = (137, 236)
    c.model.name = 'efficientnet'  # -> bengrapheme/models/efficientnet.py
    c.model.args = dict(variant='b3', dtype='bfloat16')
    # timm's efficientnet_b3.ra2_in1k; torchvision's efficientnet_b3 weights load too.
    c.model.init_from = 'weights/efficientnet_b3.ra2_in1k/model.safetensors'
    # The 1st place's seen / unseen routing needs the whole-grapheme head; at this length
    # the rule (tau, seen_threshold) is tuned on val after training (not measured here).
    c.model.grapheme_head = True
    c.predict.tau = 0.0
    # The root letters (weight 0.1) and the test-time views stay from the demo, where the
    # validation family chose them (not measured at this length).
    c.render.fraction = 0.25
    # The winners' augmentation for a run this long (not measured here): affine, GridMask,
    # MixUp/CutMix.
    c.aug.update(affine=True, grid_mask_prob=0.3, mixup_alpha=0.4, mix_prob=0.5)
    # The pretrained trunk at half the heads' learning rate, so the first updates from the
    # random heads do not wash out its features (common fine-tuning practice; not tuned here).
    c.train.update(steps=45000, batch_size=256, lr=1e-3, warmup_steps=1000,
                   ema_decay=0.999, log_every=100, checkpoint_every=1000)
    c.train.groups = dict(backbone=dict(pattern='backbone/.*', lr_scale=0.5, frozen_steps=0))
    c.evals = dict(val=dict(type='grapheme', every=2500))  # Kaggle's test has no labels
    c.eval.batch_size = 512
    c.render.images = 200000  # ~25 core-minutes to draw, 6.5 GB, once
  elif arg == 'test':
    defaults.test_size(c, steps=8)
    c.input.size = (32, 56)
    c.model.args = dict(depth=10, width=8, stem='small', dtype='float32')
    c.model.update(grapheme_head=True, root_letters=True)  # every head and loss term runs
    c.predict.tau = 0.0  # the bad-input tests predict from workdirs no training wrote
    c.data.update(val_fraction=0.25, corrected_labels=True)
    c.eval.batch_size = 16
    c.render.update(images=48, workers=1)
    c.aug.update(affine=True, erase_prob=0.5, grid_mask_prob=0.3, mix_prob=0.5)  # all run
    c.unseen.val_graphemes = 0.01

  c.lock()  # a mistyped override key is an error, before any work starts
  return c


def get_sweeps(arg='demo'):
  """The sweeps of each variant (bengrapheme/sweep.py; docs/sweeps.md). The demo's choose on
  the validation family (drawn unlike training: other fonts, other distortions), scored as
  the test split of its own folder:

    python -m bengrapheme.grapheme.synth_val --out data/bengali-val2 --num 2000 --seed 0
    python -m launch.sweep --config configs/grapheme.py:demo --sweep lr_tau \
        --data data/bengali-synth --workdir workdirs/sweeps/grapheme-lr_tau
  """
  size = defaults.arguments(arg, 'configs/grapheme.py', size=VARIANTS).size
  if size == 'demo':
    # The learning rate and the prior correction (predict.tau: 'score' is the configured
    # rule's), pruned at the family's evaluations of steps 1,000-3,000.
    return {'lr_tau': dict(
        space={'train.lr': dict(low=8e-3, high=6.4e-2, log=True),
               'predict.tau': [0.0, 0.25, 0.5, 0.75, 1.0]},
        choose='valfam', metric='score', every=1000, trials=12, sampler='tpe',
        pruner='median', baseline=True,
        evals={'valfam': dict(type='grapheme', split='test', data='data/bengali-val2')})}
  if size == 'test':
    return {'smoke': dict(space={'train.lr': [1e-3, 1e-2]}, choose='val', every=4, trials=2,
                          sampler='grid', pruner='median', startup_trials=1)}
  return {}
