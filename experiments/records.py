"""The records behind the accuracy tables of README.md, docs/ and experiments/results.md: one
small JSON file a run.

  # after `launch.evaluate` of a run, keep its scores (the commands as they were typed):
  python -m experiments.records add --name grapheme-demo --workdir W --command '...' --command '...'
  # after `launch.sweep` has finished, keep its trials (W/sweep/record.json):
  python -m experiments.records add-sweep --name sweep-NAME --workdir W
  # redraw the tables in README.md, docs/*.md and experiments/*.md from the records:
  python -m experiments.records readme

A record (experiments/records/NAME.json) holds the commands that produced the run, the commit
whose tree holds the code they ran (HEAD by default, which `add` takes only from a checkout
with no uncommitted code; `commits`, one a command, where they ran at several), the date, the
machine, a note, and every score of W/eval/metrics.json (flattened, 'split/a/b' keys). The
tables are drawn from records only (TABLES below), between `<!-- records:TABLE:begin -->` and
`<!-- records:TABLE:end -->` in whichever pages hold those markers (a table may stand in more
than one page, and must stand in at least one); each table's links to its records are
relative to its page. tests/core/test_records.py checks that every page holds exactly what
the records say, and that each command's module is in its commit's tree.
"""
import argparse
import ast
import datetime
import glob
import json
import os
import subprocess

from bench import common, run
from bengrapheme import inference, files

RECORDS = os.path.join(common.ROOT, 'experiments', 'records')
README = os.path.join(common.ROOT, 'README.md')
FIELDS = ('name', 'commands', 'commit', 'date', 'machine', 'note', 'scores')

GRAPHEME_COLUMNS = (
    ('val, mean of seen and unseen (what chooses)', 'val/tuned/configured_balanced_score'),
    ('test, all', 'test/combined/all/score'),
    ('seen', 'test/combined/seen/score'),
    ('unseen, rendered', 'test/combined/unseen_rendered/score'),
    ('unseen, never rendered', 'test/combined/unseen_never_rendered/score'))
BY_CATEGORY = (('all', 'all/score'), ('seen', 'seen/score'),
               ('unseen, rendered', 'unseen_rendered/score'),
               ('unseen, never rendered', 'unseen_never_rendered/score'),
               ('root recall, all', 'all/grapheme_root'))
# A val split's categories: its unseen graphemes are the held-out val graphemes.
VAL_BY_CATEGORY = (('all', 'all/score'), ('seen', 'seen/score'),
                   ('graphemes held out of training', 'unseen_never_rendered/score'),
                   ('root recall, seen', 'seen/grapheme_root'),
                   ('root recall, held out', 'unseen_never_rendered/grapheme_root'))
# Across families: a row is a recipe, its records NAME + suffix, one per data set it was
# scored on; the validation family chooses, the others report.
ACROSS_FAMILIES = (
    ('validation family (chooses)', '-val-family', 'test/combined/all/score'),
    ('its seen', '-val-family', 'test/combined/seen/score'),
    ('its unseen', '-val-family', 'test/combined/unseen/score'),
    ('its root recall', '-val-family', 'test/combined/all/grapheme_root'),
    ("own test (synth.py at c3a0efe)", '-own-test-v1', 'test/combined/all/score'),
    ('its unseen', '-own-test-v1', 'test/combined/unseen/score'),
    ('third family (reports)', '-other-family', 'test/combined/all/score'),
    ('its unseen', '-other-family', 'test/combined/unseen/score'))
FRAGMENT_COLUMNS = (('writer mAP', 'writer/map'), ('writer Top-1', 'writer/top1'),
                    ('writer Pr@10', 'writer/pr10'), ('page mAP', 'page/map'),
                    ('page Top-1', 'page/top1'))
# experiments/collection_hits.py: finding the same hand through an index, as a scholar searches.
HIT_COLUMNS = (('top 10 hold the same writer', 'hit10'), ('nearest is the same writer', 'top1'),
               ('queries', 'num_queries'))
# Recipes across families, each adding one part to the row above (or to the row named).
RECIPES_ACROSS_FAMILIES = (
    ('7 Debian fonts, `input.stretch_contrast` (`make demo` at c3a0efe)', 'grapheme-before-fonts'),
    ('+ Google Fonts\' Bengali families', 'grapheme-fonts'),
    ('+ Google fonts, `render.fraction=0.5`', 'grapheme-fonts-render0.5'),
    ('+ Google fonts, `aug.affine`', 'grapheme-fonts-affine'),
    ('+ Google fonts, monoline pen, stronger warps, pen breaks', 'grapheme-hand'),
    ('+ those, `aug.affine`', 'grapheme-hand-affine'),
    ('+ those, GridMask 0.3', 'grapheme-hand-gridmask'),
    ('+ those, CutMix 0.5', 'grapheme-hand-cutmix'),
    ('+ `aug.affine`, no whole-grapheme head', 'grapheme-hand-nowhole'),
    ('+ prior correction tau 0.5', 'grapheme-hand-nowhole-tau0.5'),
    ('+ `render.fraction=0.5`', 'grapheme-nowhole-render0.5'),
    ('the same, a second seed (`--config.seed=1`)', 'grapheme-demo-now-seed1'),
    ('`render.fraction=0.75` instead', 'grapheme-nowhole-render0.75'),
    ('+ 48,000 rendered images instead of 16,000', 'grapheme-demo-now-images48k'),
    ('+ 2,800 steps instead of 2,000', 'grapheme-demo-now-steps2800'),
    ('+ 3,400 steps instead of 2,800 (about 10 minutes)', 'grapheme-demo-now-steps3400'),
    ('4,000 steps instead (about 12 minutes: past the time `make demo` has)',
     'grapheme-demo-now-steps4000'),
    ('4,000 steps with `train.ema_decay=0.999` (not chosen)', 'grapheme-demo-now-ema'),
    ('`make demo` + the root from its letters too (`model.root_letters`, weight 0.5)',
     'grapheme-rootletters'),
    ('the same, letters weight 0.1', 'grapheme-rootletters-w0.1'),
    ('+ learning rate 4e-3 instead of 2e-3', 'grapheme-rootletters-w0.1-lr4e-3'),
    ('learning rate 8e-3 instead', 'grapheme-rootletters-w0.1-lr8e-3'),
    ('learning rate 1.6e-2 instead', 'grapheme-rootletters-w0.1-lr1.6e-2'),
    ('learning rate 3.2e-2 instead', 'grapheme-rootletters-w0.1-lr3.2e-2'),
    ('learning rate 6.4e-2 instead', 'grapheme-rootletters-w0.1-lr6.4e-2'),
    ('lr 3.2e-2 + test-time views (2, 4, 8): `make demo` (about 11 minutes)',
     'grapheme-demo-letters'),
    ('the same, a second seed (`--config.seed=1`)', 'grapheme-demo-letters-seed1'))
# Test-time views (config.predict.tta_margins), chosen on the validation family: the margins
# on one run, then the choice on the learning-rate runs.
TTA_MARGINS = (
    ('letters 0.1, lr 2e-3, one view (margin 4, as trained)', 'grapheme-rootletters-w0.1'),
    ('the same run, margins (2, 4, 8)', 'grapheme-rootletters-w0.1-tta2-4-8'),
    ('the same run, margins (2, 4, 6)', 'grapheme-rootletters-w0.1-tta2-4-6'),
    ('the same run, margins (4, 8, 12)', 'grapheme-rootletters-w0.1-tta4-8-12'),
    ('the same run, margins (0, 2, 4, 6, 8)', 'grapheme-rootletters-w0.1-tta0-2-4-6-8'),
    ('the same run, margins (0, 4, 8, 12)', 'grapheme-rootletters-w0.1-tta0-4-8-12'),
    ('the same run, margins (0, 4, 8, 12, 16)', 'grapheme-rootletters-w0.1-tta0-4-8-12-16'),
    ('lr 4e-3, one view', 'grapheme-rootletters-w0.1-lr4e-3'),
    ('the same run, margins (2, 4, 8)', 'grapheme-rootletters-w0.1-lr4e-3-tta2-4-8'),
    ('lr 8e-3, one view', 'grapheme-rootletters-w0.1-lr8e-3'),
    ('the same run, margins (2, 4, 8)', 'grapheme-rootletters-w0.1-lr8e-3-tta2-4-8'),
    ('lr 1.6e-2, one view', 'grapheme-rootletters-w0.1-lr1.6e-2'),
    ('the same run, margins (2, 4, 8)', 'grapheme-rootletters-w0.1-lr1.6e-2-tta2-4-8'),
    ('lr 3.2e-2, one view', 'grapheme-rootletters-w0.1-lr3.2e-2'),
    ('the same run, margins (2, 4, 8)', 'grapheme-rootletters-w0.1-lr3.2e-2-tta2-4-8'))
# SAGHOG's recipe at the CPU time of the ResNet-20 demo, one part switched at a time.
SAGHOG_ARMS = (
    ('ResNet-20 + GeM (`configs/fragments.py:demo` at 0585c3b, no scale augmentation)',
     'fragments-demo'),
    ('ViT from scratch + GeM', 'saghog-demo-gem-scratch'),
    ('ViT from scratch + NetRVLAD', 'saghog-demo-scratch'),
    ('ViT MaskFeat-pre-trained + NetRVLAD, layer decay 0.25', 'saghog-demo'),
    ('ViT MaskFeat-pre-trained + NetRVLAD, layer decay 0.75: val\'s choice, `make demo-saghog`',
     'saghog-demo-ld0.75'),
    ('ViT MaskFeat-pre-trained + NetRVLAD, no layer decay', 'saghog-demo-ld1'))
# A fragment recipe scored by experiments/fragment_family.py on three sets, writer mAP;
# "x SRS-LBP" divides by SRS-LBP's on the same set.
FAMILY_SETS = (('validation family (chooses)', 'valfam'), ('own test (reports)', 'test'),
               ('third draw (reports)', 'third'))
FAMILY_COLUMNS = tuple(
    column for label, key in FAMILY_SETS for column in (
        (f'{label}: SRS-LBP', f'{key}/srs_lbp/writer/map'),
        ('encoder', f'{key}/encoder/writer/map'), ('x SRS-LBP', f'{key}/ratio/encoder'),
        ('+ post-processing', f'{key}/tuned/writer/map'), ('x SRS-LBP', f'{key}/ratio/tuned')))
# (label, record), in the order they ran; each row changes one part of the row it names.
FAMILY_RUNS = (
    ('`configs/fragments.py:demo` at f5d169b, no scale augmentation', 'fragfam-demo'),
    ('+ scale augmentation 0.7 / 1 / 1.4, in training and at test time: the family\'s '
     'choice', 'fragfam-scales'),
    ('the same at learning rate 4e-3 (2e-3 above)', 'fragfam-lr4e-3'),
    ('the same at learning rate 8e-3: the family\'s choice by hand, the sweep\'s trial 0',
     'fragfam-lr8e-3'),
    ('the same with SAGHOG\'s multi-similarity constants (alpha 2, beta 40, base 0.2; '
     'ours 2 / 50 / 0.5): not taken', 'fragfam-lr8e-3-ms-saghog'),
    ('the same (ours) with P x K = 32 writers x 8 patches (16 x 16): not taken',
     'fragfam-lr8e-3-pk32x8'),
    ('upper bound, chooses nothing: the 8e-3 recipe trained on 60 writers in '
     'the family\'s look, training\'s fonts (`synth_val --train 60`)', 'fragfam-lr8e-3-upper'),
    ('the 8e-3 recipe with 48 px patches (32): not taken, and more than twice '
     'the training time', 'fragfam-lr8e-3-patch48'),
    ('the 8e-3 recipe\'s model scored at one scale, 1.0 (0.7 / 1 / '
     '1.4): what the test-time half of the scales does', 'fragfam-lr8e-3-evalscale1'),
    ('the 8e-3 recipe\'s model scored with up to 96 patches a fragment (48)',
     'fragfam-lr8e-3-evalpatches96'),
    ('the 8e-3 recipe\'s model, its patches aggregated by VLAD over 8 k-means centres '
     '(summed): not taken', 'fragfam-lr8e-3-evalvlad'),
    ('the 8e-3 recipe trained on 500 surrogate classes (k-means of the '
     'patches\' SIFT descriptors) instead of writer labels: not taken',
     'fragfam-lr8e-3-surrogate'),
    ('the 8e-3 recipe for 1,200 steps (600): over the demo\'s budget then, '
     'not taken', 'fragfam-lr8e-3-steps1200'),
    ('the 8e-3 recipe trained and scored with up to 96 patches a fragment '
     '(48): not taken', 'fragfam-lr8e-3-patches96'),
    ('the 8e-3 recipe with NetRVLAD pooling (16 clusters) in place of GeM: '
     'not taken', 'fragfam-lr8e-3-netrvlad'),
    ('the ViT recipe as `make demo-saghog` trains it (`configs/fragments.py:recipe=saghog`: '
     'MaskFeat-pre-trained, NetRVLAD, layer decay 0.75, 490 steps): below SRS-LBP',
     'fragfam-saghog'),
    ('the 8e-3 recipe with a ResNet-32 trunk (20): not taken',
     'fragfam-lr8e-3-depth32'),
    ('the 8e-3 recipe warmed up over 150 steps (50): not taken',
     'fragfam-lr8e-3-warmup150'),
    ('the ViT recipe at learning rate 4e-3 (2e-3): not taken', 'fragfam-saghog-lr4e-3'),
    ('the ViT recipe at learning rate 1e-3: not taken', 'fragfam-saghog-lr1e-3'),
    ('the ViT recipe with layer decay 0.9 (0.75): not taken', 'fragfam-saghog-ld0.9'),
    ('the 8e-3 recipe with a trunk of width 24 (16): not taken',
     'fragfam-lr8e-3-width24'))
# The README's: `make demo-fragments`' recipe (the sweep's choice) on the three sets.
FRAGMENTS_SUMMARY = (('SRS-LBP writer mAP', 'srs_lbp/writer/map'),
                     ('encoder + post-processing', 'tuned/writer/map'), ('x SRS-LBP', 'ratio/tuned'),
                     ('writer Top-1', 'tuned/writer/top1'), ('page mAP', 'tuned/page/map'))

# experiments/family_ceiling.py: an estimate of what a descriptor of each page's drawn style reaches.
CEILING_COLUMNS = (('writer mAP', 'writer/map'),
                   ('writer mAP, weights searched on it', 'searched/writer/map'),
                   ('writer Pr@10', 'writer/pr10'),
                   ('writer Pr@100', 'writer/pr100'), ('page mAP', 'page/map'))
PROBE_COLUMNS = (('masked HOG error', 'reconstruction/loss'),
                 ('probe writer mAP', 'probe/writer/map'),
                 ('probe writer Top-1', 'probe/writer/top1'),
                 ('probe writer Pr@10', 'probe/writer/pr10'),
                 ('probe page mAP', 'probe/page/map'))
# table -> (columns (header, key) or (header, record suffix, key), rows (label, record, key
# prefix of the row's scores)).
# experiments/same_training.py: a refactor's recipes trained by the code before it and after.
SAME_TRAINING = (('arrays in the train state', 'arrays'),
                 ('arrays that differ', 'arrays_that_differ'),
                 ('largest difference', 'largest_difference'))
COUNTS = ('num_queries', 'arrays', 'arrays_that_differ', 'params', 'ran', 'input_bound',
          'fusions')
# experiments/preflight_checks.py: what launch.train --dry_run and --feed_check report.
DRY_RUN = (('parameters', 'params'), ('GFLOP an image', 'gflop_per_image'),
           ('MiB per device', 'memory_per_device_mib'), ('of which temporaries', 'temporaries_mib'),
           ('compile s', 'compile_s'), ('step run (0: did not fit, or simulated devices)', 'ran'))
FEED_CHECK = (('input examples/s', 'input_per_s'), ('host cores it kept busy', 'input_cores'),
              ('train step examples/s', 'step_per_s'),
              ('input bounds (1) or step (0)', 'input_bound'))

# experiments/decisions_retrain.py: a collection trained before and after the scholars' decisions.
DECISION_COLUMNS = (('top 10 hold the same writer', 'hit10'),
                    ('nearest is the same writer', 'top1'),
                    ('top 10, queries in no decided pair', 'undecided_hit10'),
                    ('nearest, queries in no decided pair', 'undecided_top1'),
                    ('queries', 'num_queries'),
                    ('in no decided pair', 'undecided_num_queries'))

# experiments/compile_time.py: EfficientNet-B0's train step compiled with a part taken away.
COMPILE_TIME = (('trace + lower s', 'lower_s'), ("XLA's compile s", 'compile_s'),
                ('in all s', 'total_s'), ('CPU s', 'cpu_s'), ('fusions', 'fusions'))
# experiments/setup_sizes.py: what the two setups install, in MB.
SETUP_SIZES = (('demo venv, fresh', 'demo_venv_mb'), ('test venv', 'test_venv_mb'),
               ('of which torch', 'torch_mb'), ('NVIDIA libraries', 'nvidia_mb'),
               ('triton', 'triton_mb'), ('npm fonts', 'npm_fonts_mb'),
               ("Debian's chromium", 'debian_chromium_mb'),
               ('chromium-common', 'debian_chromium_common_mb'))

# A sweep's table is drawn from its record alone: every trial, the baseline and the choice.
SWEEP_TABLES = {'grapheme-lr_tau-sweep': 'sweep-grapheme-lr_tau',
                'fragments-recipe-sweep': 'sweep-fragments-recipe'}
# The sweep's choice and the settings it replaced, on every set, after the choice was made.
SWEEP_CHOICE = (('validation family (chose)', '-val-family', 'test/combined/all/score'),
                ('its unseen', '-val-family', 'test/combined/unseen/score'),
                ('own test (reports)', '-own-test', 'test/combined/all/score'),
                ('its unseen', '-own-test', 'test/combined/unseen/score'),
                ('third family (reports)', '-other-family', 'test/combined/all/score'),
                ('its unseen', '-other-family', 'test/combined/unseen/score'))

TABLES = {
    **SWEEP_TABLES,
    'grapheme-lr_tau-choice': (SWEEP_CHOICE, (
        ('the settings before the sweep, its trial 0: lr 3.2e-2, tau 0.5',
         'sweep-grapheme-lr_tau-baseline', ''),
        ("the sweep's choice, trial 1: lr 0.0317, tau 0.0: `make demo`",
         'sweep-grapheme-lr_tau-chosen', ''))),
    'fragments-recipe-choice': (FAMILY_COLUMNS, (
        ('the settings before the sweep, its trial 0: lr 8e-3, warm-up 50, 600 steps, P 16, '
         '32 px patches, up to 48 a fragment, scales 0.7 / 1 / 1.4',
         'sweep-fragments-recipe-baseline', ''),
        ("the sweep's choice, trial 3: lr 0.0074, warm-up 50, 900 steps, P 16, 48 px "
         "patches, up to 32 a fragment, scales 0.7 / 1 / 1.4: `make demo-fragments`",
         'sweep-fragments-recipe-chosen', ''),
    )),
    'compile-time': (COMPILE_TIME, (
        ("the trainer's step (`bench/train_step.py`'s case)", 'compile-time', 'step/'),
        ('plain SGD in place of global-norm clipping + AdamW', 'compile-time', 'sgd/'),
        ("XLA's grouped convolution in place of `depthwise.py`'s loops", 'compile-time',
         'native_dw/'),
        ('both at once: the network alone', 'compile-time', 'bare/'),
        ("the trainer's step again, read back from the compilation cache a first process "
         'filled (`--compile_cache`)', 'compile-time', 'cached/'))),
    'setup-sizes': (SETUP_SIZES, (('this machine, MB', 'setup-sizes', ''),)),
    'dry-run-costs': (DRY_RUN, (
        ('`configs/grapheme.py:kaggle`, its batch of 256, 1 CPU device', 'preflight-checks',
         'kaggle/'),
        ('the same for 8 simulated devices (`--dry_run_devices=8`)', 'preflight-checks',
         'kaggle_8_devices/'),
        ('`configs/fragments.py:hisfrag20` at batch 8, 1 CPU device', 'preflight-checks',
         'hisfrag20_batch8/'))),
    'feed-check': (FEED_CHECK, (
        ('`configs/grapheme.py:demo`, 2,000 synthetic images, 1 CPU device', 'preflight-checks',
         'demo_feed/'),)),
    'same-training-task-protocol': (SAME_TRAINING, tuple(
        (f'`{recipe}`', 'same-training-task-protocol', f'{key}/') for recipe, key in (
            ('configs/grapheme.py:test', 'grapheme'),
            ('configs/fragments.py:test', 'fragments'),
            ('configs/fragments.py:recipe=saghog,size=test', 'saghog')))),
    # make demo before the sweep on the three families (docs/graphemes.md has the rest).
    'grapheme-summary': (tuple(ACROSS_FAMILIES[i] for i in (0, 2, 4, 5, 6, 7)), (
        ('`make demo` before the sweep (lr 3.2e-2, tau 0.5)', 'grapheme-demo-letters', ''),
        ('the same, a second seed (`--config.seed=1`)', 'grapheme-demo-letters-seed1', ''))),
    'grapheme-across-families': (ACROSS_FAMILIES, tuple(
        (label, record, '') for label, record in RECIPES_ACROSS_FAMILIES) + (
        ("upper bound, chooses nothing: the sixth row's recipe trained on the validation "
         "family's own look (`synth_val --train`)", 'grapheme-family-trained', ''),
        ("upper bound, chooses nothing: the `render.fraction=0.5` row's recipe trained on the "
         "family's own look", 'grapheme-family-trained-now', ''))),
    'grapheme-test-time-views': (ACROSS_FAMILIES[:4], tuple(
        (label, record, '') for label, record in TTA_MARGINS)),
    # The same runs on their own data; the first row's rerun has no such record.
    'grapheme-recipes-own-data': (GRAPHEME_COLUMNS, tuple(
        (label, record, '') for label, record in RECIPES_ACROSS_FAMILIES[1:])),
    'grapheme-family-upper-bound': (VAL_BY_CATEGORY, (
        ("the sixth row: its own val split, in the training renderer's look",
         'grapheme-hand-affine', 'val/combined/'),
        ("the sixth row's recipe trained on the family's look: its own val split",
         'grapheme-family-trained', 'val/combined/'),
        ("`render.fraction=0.5`: its own val split, in the training renderer's look",
         'grapheme-nowhole-render0.5', 'val/combined/'),
        ("`render.fraction=0.5`'s recipe trained on the family's look: its own val split",
         'grapheme-family-trained-now', 'val/combined/'))),
    'grapheme-family-diagnosis': (BY_CATEGORY, tuple(
        (label, f'grapheme-fonts-diag-{name}', 'test/combined/') for label, name in (
            ("the family's fonts, none of its distortions", 'family-fonts-bare'),
            ("training's Debian designs, none of the distortions", 'training-fonts-bare'),
            ('training\'s designs + thin-plate warp', 'training-fonts-warp'),
            ('training\'s designs + pen by morphology', 'training-fonts-pen'),
            ('training\'s designs + pressure and dry-pen gaps', 'training-fonts-pressure'),
            ('training\'s designs + blur', 'training-fonts-blur'),
            ('training\'s designs + paper, noise, JPEG', 'training-fonts-paper'),
            ("training's designs + all the family's distortions", 'training-fonts-all')))),
    'grapheme-demo': (GRAPHEME_COLUMNS, (
        ('`render.fraction=0.5`', 'grapheme-demo-render0.5', ''),
        ('`render.fraction=0.25`, no routing: val\'s choice', 'grapheme-demo', ''),
        ('+ `input.stretch_contrast`: the validation family\'s choice',
         'grapheme-demo-stretch', ''),
        ('+ Google fonts, monoline pen, warps, pen breaks: the family\'s choices',
         'grapheme-hand', ''),
        ('+ `aug.affine`: the family\'s choice', 'grapheme-hand-affine', ''),
        ('+ no whole-grapheme head, prior correction tau 0.5: the family\'s choices',
         'grapheme-hand-nowhole-tau0.5', ''),
        ('+ `render.fraction=0.5`: the family\'s choice', 'grapheme-nowhole-render0.5', ''),
        ('+ 48,000 rendered images: the family\'s choice', 'grapheme-demo-now-images48k', ''),
        ('+ 2,800 steps: the family\'s choice', 'grapheme-demo-now-steps2800', ''),
        ('+ 3,400 steps: the most in about 10 minutes', 'grapheme-demo-now-steps3400', ''),
        ('+ the root from its letters, lr 3.2e-2, test-time views: the family\'s choices, '
         '`make demo`', 'grapheme-demo-letters', ''))),
    'grapheme-val-family': (BY_CATEGORY, (
        ('no stretch: validation family (`synth_val`)', 'grapheme-demo-val-family',
         'test/combined/'),
        ("no stretch: the project's own test", 'grapheme-demo', 'test/combined/'),
        ('no stretch + augmentation (affine, GridMask, CutMix): validation family',
         'grapheme-demo-aug-val-family', 'test/combined/'),
        ("no stretch + augmentation: the project's own test", 'grapheme-demo-aug',
         'test/combined/'),
        ('`input.stretch_contrast`: validation family',
         'grapheme-demo-stretch-val-family', 'test/combined/'),
        ("`input.stretch_contrast`: the project's own test",
         'grapheme-demo-stretch', 'test/combined/'),
        ('second seed (`--config.seed=1`), no stretch: validation family',
         'grapheme-demo-seed1-val-family', 'test/combined/'),
        ("second seed, no stretch: the project's own test", 'grapheme-demo-seed1',
         'test/combined/'),
        ('second seed, `input.stretch_contrast`: validation family',
         'grapheme-demo-stretch-seed1-val-family', 'test/combined/'),
        ("second seed, `input.stretch_contrast`: the project's own test",
         'grapheme-demo-stretch-seed1', 'test/combined/'))),
    'fragments-demo': (FRAGMENT_COLUMNS, (
        ('val: SRS-LBP', 'fragments-demo', 'val/srs_lbp/'),
        ('val: encoder', 'fragments-demo', 'val/encoder/'),
        ('val: encoder + what val chose (in-sample)', 'fragments-demo', 'val/tuned/'),
        ('test: SRS-LBP baseline', 'fragments-demo', 'test/srs_lbp/'),
        ('test: encoder', 'fragments-demo', 'test/encoder/'),
        ("test: encoder + val's choice",
         'fragments-demo', 'test/tuned/'),
        ('other collection: SRS-LBP baseline', 'fragments-demo-other', 'test/srs_lbp/'),
        ('other collection: encoder', 'fragments-demo-other', 'test/encoder/'),
        ("other collection: encoder + val's choice", 'fragments-demo-other',
         'test/tuned/'))),
    'decisions-retrain': (DECISION_COLUMNS, (
        ('before: surrogate classes only (`configs/fragments.py:data=collection`, 300 steps)',
         'decisions-retrain', 'before/'),
        ('after: the same training with 100 decisions (`--config.data.decisions`)',
         'decisions-retrain', 'after/'))),
    'collection-hits': (HIT_COLUMNS, (
        ('test writers: encoder', 'fragments-collection-hits', 'test/encoder/'),
        ('test writers: SRS-LBP', 'fragments-collection-hits', 'test/srs_lbp/'),
        ("test writers: fused at val's weight", 'fragments-collection-hits', 'test/fused/'),
        ('other draw: encoder', 'fragments-collection-hits-other', 'test/encoder/'),
        ('other draw: SRS-LBP', 'fragments-collection-hits-other', 'test/srs_lbp/'),
        ("other draw: fused at val's weight", 'fragments-collection-hits-other',
         'test/fused/'))),
    'saghog-demo': (FRAGMENT_COLUMNS, tuple(
        (f'val: {label}, encoder (chooses)', record, 'val/encoder/')
        for label, record in SAGHOG_ARMS) + tuple(
        (f'test: {label}, encoder', record, 'test/encoder/')
        for label, record in SAGHOG_ARMS) + tuple(
        (f"test: {label}, encoder + val's post-processing", record, 'test/tuned/')
        for label, record in SAGHOG_ARMS)),
    'fragments-family': (FAMILY_COLUMNS, tuple(
        (label, record, '') for label, record in FAMILY_RUNS)),
    'fragments-summary': (FRAGMENTS_SUMMARY, (
        ('validation family: chooses', 'sweep-fragments-recipe-chosen', 'valfam/'),
        ('own test (30 writers): reports', 'sweep-fragments-recipe-chosen', 'test/'),
        ('third draw (32 writers): reports', 'sweep-fragments-recipe-chosen', 'third/'))),
    'family-ceiling': (CEILING_COLUMNS, (
        ('the validation family (chooses)', 'family-ceiling', 'valfam/'),
        ('the third draw (reports)', 'family-ceiling', 'third/'),
        ("the own test (reports; retrieval/synthetic/synth.py's draw)", 'family-ceiling', 'test/'))),
    'maskfeat-demo': (PROBE_COLUMNS, (
        ('val writers: the untrained trunk', 'maskfeat-demo-untrained', 'val/'),
        ('val writers: `configs/maskfeat.py:demo`, 600 steps', 'maskfeat-demo', 'val/'))),
}


def record_names(name):
  """The records table `name` reads, in order."""
  if name in SWEEP_TABLES:
    return [SWEEP_TABLES[name]]
  columns, rows = TABLES[name]
  suffixes = list(dict.fromkeys(c[1] if len(c) == 3 else '' for c in columns))
  return [record + suffix for _, record, _ in rows for suffix in suffixes]


def path_of(name):
  return os.path.join(RECORDS, f'{name}.json')


def load(name):
  with open(path_of(name)) as f:
    record = json.load(f)
  missing = [k for k in FIELDS if k not in record]
  if missing:
    raise ValueError(f'{path_of(name)}: lacks {", ".join(missing)}')
  return record


def pages():
  """The markdown pages that may hold tables: README.md, then docs/*.md, experiments/*.md."""
  return [README] + sorted(glob.glob(os.path.join(common.ROOT, 'docs', '*.md'))) + sorted(
      glob.glob(os.path.join(common.ROOT, 'experiments', '*.md')))


def _shown(page):
  return os.path.relpath(page, common.ROOT)


def table(name, page=None):
  """The markdown table `name` of TABLES, every number read from its record; the links to
  the records are relative to `page` (default README.md)."""
  here = os.path.dirname(page or README)
  if name in SWEEP_TABLES:
    return sweep_table(SWEEP_TABLES[name], here)
  columns, rows = TABLES[name]
  lines = ['| run | ' + ' | '.join(column[0] for column in columns) + ' | record |',
           '|---' * (len(columns) + 2) + '|']
  for label, row_record, prefix in rows:
    cells, shown = [], []
    for column in columns:
      record_name = row_record + (column[1] if len(column) == 3 else '')
      key = prefix + column[-1]
      scores = load(record_name)['scores']
      if key not in scores:
        raise KeyError(f'experiments/records/{record_name}.json has no score {key}')
      value = scores[key]
      cells.append(f'{int(value):,}' if key.endswith(COUNTS) else f'{value:.3f}')
      if record_name not in shown:
        shown.append(record_name)
    links = ', '.join(f'[{name}]({os.path.relpath(path_of(name), here)})'.replace(os.sep, '/')
                      for name in shown)
    lines.append(f'| {label} | ' + ' | '.join(cells) + f' | {links} |')
  return '\n'.join(lines)


def _setting(value):
  """A parameter as the table shows it: a float to 3 significant digits, a tuple (a JSON
  list in the record) as code."""
  if isinstance(value, float):
    return f'{value:.3g}'
  return f'`{tuple(value)}`' if isinstance(value, list) else str(value)


def sweep_table(name, here):
  """Every trial of the sweep record `name`: its settings, the choosing metric, its state and
  the step it reached; the config's own settings and the chosen trial marked."""
  record = load(name)
  sweep = record['sweep']
  params = ast.literal_eval(sweep['declaration']['space'])
  metric = f'{sweep["declaration"]["choose"]}/{sweep["declaration"]["metric"]}'
  chosen = sweep['chosen']['trial']  # add_sweep keeps finished sweeps only
  lines = ['| trial | ' + ' | '.join(f'`{p}`' for p in params) +
           f' | {metric} (chooses) | state | step | |',
           '|---' * (len(params) + 5) + '|']
  for trial in sweep['trials']:
    marks = [m for m, on in (("the config's own", trial['baseline'] == 'yes'),
                             ('chosen', trial['trial'] == chosen)) if on]
    value = '' if trial[metric] == '' else f'{trial[metric]:.4f}'  # '': pruned unevaluated
    lines.append(
        f'| {trial["trial"]} | ' + ' | '.join(_setting(trial[p]) for p in params) +
        f' | {value} | {trial["state"]} | {trial["step"]:,} | {", ".join(marks)} |')
  test = f'chosen/test/{sweep["declaration"]["metric"]}'
  if test in record['scores']:
    lines.append(f'\nThe chosen trial on the test split, scored once after the sweep (it '
                 f'chose nothing): {test[len("chosen/"):]} {record["scores"][test]:.4f}.')
  link = os.path.relpath(path_of(name), here).replace(os.sep, '/')
  lines.append(f'\nRecord: [{name}]({link}) (`{record["commands"][0]}` at '
               f'{record["commit"][:7]}).')
  return '\n'.join(lines)


def markers(name):
  return f'<!-- records:{name}:begin -->', f'<!-- records:{name}:end -->'


def block(text, name, page=None):
  """What the page's text holds between table `name`'s markers."""
  begin, end = markers(name)
  start, stop = text.find(begin), text.find(end)
  if start < 0 or stop < start:
    raise ValueError(f'{_shown(page or README)}: no {begin} ... {end} section for table '
                     f'{name!r}')
  return text[start + len(begin):stop].strip('\n')


def _read(page):
  with open(page) as f:
    return f.read()


def pages_holding(name, candidates=None):
  """The pages (of `candidates`, default pages()) that hold table `name`'s begin marker; an
  error naming the table when none does."""
  candidates = pages() if candidates is None else list(candidates)
  holders = [p for p in candidates if markers(name)[0] in _read(p)]
  if not holders:
    begin, end = markers(name)
    raise ValueError(f'table {name!r}: no page holds {begin} ... {end} (looked in '
                     f'{", ".join(_shown(p) for p in candidates)})')
  return holders


def write_pages(candidates=None):
  """Redraws every table in every page that holds it; a page is rewritten only if it
  changes."""
  holding = {name: pages_holding(name, candidates) for name in TABLES}
  for page in sorted({p for holders in holding.values() for p in holders}):
    text = new = _read(page)
    for name, holders in holding.items():
      if page not in holders:
        continue
      block(new, name, page)  # both markers there, in order
      begin, end = markers(name)
      new = (new[:new.index(begin) + len(begin)] + f'\n{table(name, page)}\n' +
             new[new.index(end):])
    if new != text:
      files.write_atomic(page, new)


def _git(*args):
  return subprocess.run(['git', *args], cwd=common.ROOT, capture_output=True, text=True)


def _changed_code():
  """The checkout's paths that differ from HEAD (untracked ones too), but the pages and the
  records, which hold no code that makes a run."""
  paths = [line[3:].split(' -> ')[-1].strip('"')
           for line in _git('status', '--porcelain').stdout.splitlines()]
  return [p for p in paths if not p.endswith('.md') and not p.startswith('experiments/records/')]


def commit_of(commit=''):
  """The full hash of `commit`; by default HEAD's, and only when the checkout holds no change
  to code, so that a record names the commit whose tree holds the code that made it. A
  study calls it before its run; what it cannot give is a one-line exit naming the fix."""
  if commit:
    out = _git('rev-parse', '--verify', '--quiet', f'{commit}^{{commit}}')
    if out.returncode:
      raise SystemExit(f'commit {commit!r}: no such commit in this repository; give the one '
                       'the commands ran at')
    return out.stdout.strip()
  changed = _changed_code()
  if changed:
    shown = ', '.join(changed[:4]) + (f' and {len(changed) - 4} more' if len(changed) > 4 else '')
    raise SystemExit(f'the checkout has changes git has not committed ({shown}): commit them, '
                     'or run in a clean `git worktree add DIR HEAD`, then make the record again, '
                     "so that its commit holds the code that made it")
  return _git('rev-parse', 'HEAD').stdout.strip()


def add(name, workdir, commands, commit, note, scores=None, commits=None):
  """Keeps the run's scores (W/eval/metrics.json, or `scores` measured by a study). `commit`
  (default: HEAD, in a clean checkout) is the one the commands ran at; where they ran at
  different ones, `commits` names each command's, in order, and the record's is the last."""
  if commits:
    if len(commits) != len(commands):
      raise SystemExit(f'{len(commits)} commits for {len(commands)} commands: give one commit, '
                       'or one a command, in order')
    commits = [commit_of(c) for c in commits]
    commit = commits[-1]
  else:
    commit = commit_of(commit)
  if scores is None:
    with open(os.path.join(workdir, 'eval', 'metrics.json')) as f:
      scores = json.load(f)
  scores = inference.flatten(scores)
  record = dict(name=name, commands=commands, commit=commit,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                machine=run.machine(), note=note, scores=scores)
  if commits and len(set(commits)) > 1:
    record['commits'] = commits
  os.makedirs(RECORDS, exist_ok=True)
  files.write_atomic(path_of(name), json.dumps(record, indent=1, sort_keys=True) + '\n')
  return path_of(name)


def add_sweep(name, workdir, note):
  """Keeps a finished sweep (W/sweep/record.json) as experiments/records/NAME.json: its
  command and commit, and each trial's choosing metric as the scores."""
  path = os.path.join(workdir, 'sweep', 'record.json')
  try:
    with open(path) as f:
      sweep = json.load(f)
  except FileNotFoundError:
    raise SystemExit(f'{path}: no sweep record there; give --workdir the folder '
                     'launch.sweep ran in') from None
  running = [t['trial'] for t in sweep['trials'] if t['state'] == 'running']
  if running or not sweep.get('chosen'):
    raise SystemExit(f'{path}: the sweep has not finished (trials running: {running}, '
                     f'chosen: {sweep.get("chosen")}); rerun its command to finish it, then '
                     'add it')
  metric = f'{sweep["declaration"]["choose"]}/{sweep["declaration"]["metric"]}'
  scores = {f'trial/{t["trial"]:03d}/{metric}': t[metric] for t in sweep['trials']
            if t[metric] != ''}
  scores['chosen/trial'] = sweep['chosen']['trial']
  test = os.path.join(workdir, 'sweep', 'test.json')
  if os.path.exists(test):  # --report_test: the chosen trial on test, reported beside it
    with open(test) as f:
      scores.update({f'chosen/{k}': v for k, v in inference.flatten(json.load(f)).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
  record = dict(name=name, commands=[sweep['command']], commit=commit_of(sweep['commit']),
                date=sweep['date'], machine=run.machine(), note=note, scores=scores,
                sweep=sweep)
  os.makedirs(RECORDS, exist_ok=True)
  files.write_atomic(path_of(name), json.dumps(record, indent=1, sort_keys=True) + '\n')
  return path_of(name)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  commands = parser.add_subparsers(dest='what', required=True)
  a = commands.add_parser('add', help="keep a run's scores as experiments/records/NAME.json")
  a.add_argument('--name', required=True)
  a.add_argument('--workdir', required=True, help='the run, evaluated (W/eval/metrics.json)')
  a.add_argument('--command', action='append', required=True, dest='commands',
                 help='a command of the run, as typed (repeat, in order)')
  a.add_argument('--commit', action='append', default=[], dest='commits',
                 help='the commit the commands ran at (default: HEAD, which needs a checkout '
                 'with no uncommitted change to code); repeat, one a command in order, where '
                 'they ran at different commits')
  a.add_argument('--note', default='', help='what else a reader needs: load, interruptions')
  a = commands.add_parser('add-sweep', help='keep a finished sweep as '
                          'experiments/records/NAME.json')
  a.add_argument('--name', required=True)
  a.add_argument('--workdir', required=True, help="the sweep's folder (W/sweep/record.json)")
  a.add_argument('--note', default='', help='what else a reader needs: load, interruptions')
  commands.add_parser('readme', help='redraw the tables in README.md and docs/*.md from the '
                      'records')
  args = parser.parse_args()
  if args.what == 'add':
    commit, commits = (args.commits[0], None) if len(args.commits) == 1 else ('', args.commits)
    print(add(args.name, args.workdir, args.commands, commit, args.note, commits=commits))
  elif args.what == 'add-sweep':
    print(add_sweep(args.name, args.workdir, args.note))
  else:
    write_pages()


if __name__ == '__main__':
  main()
