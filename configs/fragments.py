"""Historical fragment retrieval (ICFHR 2020 HisFrag20): a triplet-trained fragment encoder.

DATA holds train/ and test/ folders of WID_PID_FID.jpg fragments (the HisFrag20 layout).

  # CPU demo on synthetic writers (make demo-fragments runs all of it):
  python -m retrieval.synthetic.synth --out data/fragments-synth --writers-train 60 --writers-test 30 \
      --pages-per-writer 4 --seed 0 --workers 2
  python -m launch.train --config configs/fragments.py:demo --data data/fragments-synth \
      --workdir workdirs/fragments-demo
  python -m launch.evaluate --config configs/fragments.py:demo --data data/fragments-synth \
      --workdir workdirs/fragments-demo
  # The real HisFrag20 folders, on accelerators, from ImageNet weights (docs/pretrained-weights.md
  # fetches the file model.init_from names):
  python -m launch.train --config configs/fragments.py:hisfrag20 --data /data/hisfrag20 \
      --workdir gs://bucket/fragments
  # Without writer labels (surrogate classes from SIFT clusters):
  python -m launch.train --config configs/fragments.py:demo --config.train.labels=surrogate \
      --data data/fragments-synth --workdir workdirs/fragments-surrogate
  # A scholar's own folder of images (any names, nested, no labels), then index and search it:
  python -m launch.train --config configs/fragments.py:data=collection --data MY_IMAGES \
      --workdir workdirs/mine
  python -m launch.index --workdir workdirs/mine --collection MY_IMAGES  # its config.json
  python -m launch.search --workdir workdirs/mine --query MY_IMAGES/box3/f12.png
"""
import ml_collections

from bengrapheme import defaults
from configs import maskfeat

# The arguments (configs/fragments.py:size=demo,recipe=saghog; a bare word is the size).
SIZES = ('demo', 'hisfrag20', 'test')
RECIPES = ('resnet', 'saghog')
DATA = ('folder', 'collection')
VARIANTS = ('demo', 'hisfrag20', 'test', 'data=collection', 'recipe=saghog',
            'recipe=saghog,size=hisfrag20', 'recipe=saghog,size=test')


def test_size(c):
  """The tests' size: P = 4 (the 4 train writers val leaves), small PCA fits."""
  maskfeat.fragment_test_size(c)
  c.train.update(writers_per_batch=4, surrogate_classes=20)
  c.eval.update(lbp_fit_fragments=40, whitening_dims=8)


def full_size(c):
  """HisFrag20 at full size on accelerators: a tenth of train/'s writers as val (~10k of the
  101,706 fragments), 128 patches a fragment, P x K batches of 1,024 (64 writers, 16 patches
  each, as Peer et al.), 30,000 steps."""
  c.data.val_writers = 0.1
  c.input.max_patches = 128
  c.train.update(steps=30000, batch_size=1024, writers_per_batch=64, lr=1e-3, log_every=100,
                 checkpoint_every=1000, surrogate_classes=5000)
  c.eval.update(batch_size=4096, lbp_fit_fragments=5000)
  for entry in c.evals.values():
    entry.every = 5000


def saghog(c, size):
  """SAGHOG (Peer et al. 2024; marco-peer/icdar24 config/finetune_maskfeat_hisfrag.yml): the
  ViT trunk of configs/maskfeat.py, pre-trained there (model.init_from=its workdir; '' to
  train from scratch), NetRVLAD over its token map (centres by k-means on the trunk's
  features of training patches), multi-similarity on surrogate classes, AdamW with
  layer-wise decay (each block nearer the input learns at a quarter of the next one's rate),
  fragment descriptors summed, power 0.4 and PCA-whitened (to 512 at full scale). Its code
  does not intra-normalise NetRVLAD (random=True); neither does this."""
  c.model.update(name='vit', args=maskfeat.vit_args(size), pooling='netrvlad',
                 vlad_intra_norm=False)
  c.train.update(weight_decay=0.01, labels='surrogate')
  c.train.layer_decay.rate = 0.25
  c.eval.update(power=0.4)
  if size == 'demo':
    # 490 steps: the CPU time of the ResNet demo's recipe then (600 steps of 32 px patches),
    # on its writer labels, so only the model and optimizer differ; layer decay 0.75: val's
    # choice (record saghog-demo-ld0.75).
    c.train.update(labels='writer', steps=490)
    c.train.layer_decay.rate = 0.75
    c.model.init_from = 'workdirs/maskfeat-demo'
  elif size == 'hisfrag20':
    c.model.init_from = 'workdirs/maskfeat-hisfrag20'  # configs/maskfeat.py:hisfrag20's
    # 100 clusters of the 512-d tokens; the projection keeps 512 dims, the fragment
    # descriptor's PCA-whitening dims. 30 epochs of 1,024,000 patches, 5 of them warm-up.
    c.model.update(netvlad_clusters=100, embedding_dim=512)
    c.train.warmup_steps = 5000
  else:
    c.model.update(netvlad_clusters=4, embedding_dim=16)


def get_config(arg='demo'):
  a = defaults.arguments(arg, 'configs/fragments.py', size=SIZES, recipe=RECIPES, data=DATA)
  c = defaults.config()  # the trainer's fields; what follows is this task's
  c.task = 'retrieval.fragments.task'
  # data.dir holds train/ and test/; format='tfds' reads retrieval/fragments/tfds_hisfrag20.py's build,
  # 'collection' any folder of images without labels (variant collection).
  # The val split: a val_writers share of train/'s writers, drawn by val_seed and left out of
  # training (retrieval/fragments/data.py), on which the evaluator chooses its post-processing.
  c.data.update(format='folder', val_writers=0.2, val_seed=0)
  # decisions: the workbench's database (launch.serve --db): accepted and rejected pairs of a
  # collection trained beside its surrogate classes (retrieval/collections/learn.py).
  c.data.decisions = ''
  # Training and evaluation read patch_size x patch_size binarised patches centred on ink at
  # SIFT keypoints, at each fragment's own resolution (retrieval/features/patches.py), at
  # most max_patches a fragment, with an ink share within ink_bounds.
  # scales: training cuts every fragment at each of these sizes (scale augmentation: the
  # same hand as scanned at other resolutions); eval_scales: its test-time counterpart, a
  # fragment's descriptor summing the patches of every scale (retrieval/fragments/data.py).
  c.input = dict(patch_size=32, max_patches=48, ink_bounds=(0.05, 0.6), num_threads=8,
                 scales=(1.0,), eval_scales=(1.0,))
  # A CIFAR ResNet-20 (bengrapheme/models/cifar_resnet.py) -> GeM -> 64-d, per patch.
  c.model = dict(
      name='cifar_resnet', args=dict(depth=20, width=16, dtype='float32'),
      pooling='gem', netvlad_clusters=16, vlad_intra_norm=True, embedding_dim=64,
      # A PyTorch state_dict (torchvision or timm names) for the backbone to start from
      # (bengrapheme/models/pytorch_weights.py; docs/pretrained-weights.md).
      init_from='')
  # loss.name chooses one of retrieval/fragments/losses.py's LOSSES; loss.NAME holds its constants.
  # Multi-similarity with Wang et al. 2019's constants (kept on the family against SAGHOG's:
  # record fragfam-lr8e-3-ms-saghog); `--config.loss.name=batch_hard` (soft margin unless
  # `--config.loss.batch_hard.margin=0.2`) is the alternative.
  c.loss = dict(name='multi_similarity',
                multi_similarity=dict(alpha=2.0, beta=50.0, lam=0.5, epsilon=0.1),
                batch_hard=dict(margin=ml_collections.FieldReference(None, field_type=float)))
  # Mild geometric jitter only: slant and letter size identify writers.
  c.aug.update(affine=True, rotate_deg=3.0, scale=(0.95, 1.05), translate=0.05)
  # P x K batches: writers_per_batch classes, batch_size / writers_per_batch patches each.
  # labels: 'writer' (the WID of the file names) or 'surrogate' (k-means clusters of the
  # patches' SIFT descriptors: no writer labels needed; retrieval/features/surrogate.py).
  c.train.update(steps=600, batch_size=256, lr=2e-3, warmup_steps=50, log_every=25,
                 checkpoint_every=100)
  c.train.update(writers_per_batch=16, labels='writer', surrogate_classes=500)
  # Fragment descriptor: aggregation 'sum' or 'vlad' (vlad_centres k-means centres) of the
  # patch embeddings, power-normalised (power) and L2. Post-processing (retrieval/fragments/evaluate.py):
  # PCA-whitening to whitening_dims (0: none), fitted on the evaluated split itself
  # (whitening='self': transductive, no labels) or on train; SGR re-ranking with rerank_k
  # neighbours (0: none); fusion with SRS-LBP at fusion_weight (0: none). All off here: the
  # evaluator chooses each on tune_split (val) and applies that choice to test as method
  # 'tuned' (the headline); these values are method 'configured', when any is on.
  # export_method: whose distances go to eval/distances_SPLIT.{npy,csv}; the CSV has the
  # organisers' layout (no header line), or a header line of file names with
  # export_csv_header=True.
  c.evals = dict(val=dict(type='fragments', every=600),  # once, at the end
                 test=dict(type='fragments', every=600))
  c.eval.update(batch_size=512, tune_split='val')
  c.eval.update(aggregation='sum', vlad_centres=8, power=1.0, whitening='self',
                whitening_dims=0, rerank_k=0, rerank_gamma=0.2, fusion_weight=0.0,
                srs_lbp=True, lbp_fit_fragments=1000, export_distances=True,
                export_method='tuned', export_csv_header=False)

  if a.recipe == 'saghog':
    saghog(c, a.size)
  elif a.size == 'hisfrag20':
    # The same pipeline at full scale on accelerators: more patches per fragment, large P x K
    # batches (Peer et al.: 16 patches a class, batch 1,024), bf16, and an ImageNet-pretrained
    # ResNet-34 trunk (as the ResNet-34 + NetVLAD writer-retrieval results; torchvision's
    # resnet34 weights, or timm's resnet34.*). Its stem divides the input by 4 before the
    # first block, so the patches are 64 px (2 x 2 at the last stage; 32 px would leave 1 x 1).
    # The pretrained trunk learns at a tenth of the new pooling and projection's rate, frozen
    # for its first 1,000 steps, then warmed up over warmup_steps of its own (common
    # fine-tuning practice; not tuned here).
    c.input.update(max_patches=128, patch_size=64)
    c.model.update(name='resnet', init_from='weights/resnet34.tv_in1k/model.safetensors')
    c.model.args = dict(depth=34, width=64, stem='imagenet', padding='symmetric',
                        dtype='bfloat16')
    c.train.update(ema_decay=0.999, warmup_steps=1000)
    c.train.groups = dict(backbone=dict(pattern='backbone/.*', lr_scale=0.1,
                                        frozen_steps=1000))
  elif a.size == 'test':
    c.model.args = dict(depth=8, width=4, dtype='float32')
    c.model.embedding_dim = 16
  elif a.data != 'collection':
    # The sweep `recipe`'s choice on the validation family (retrieval/synthetic/synth_val.py;
    # get_sweeps below; record sweep-fragments-recipe): its trial 3. Scored once, at the end.
    c.input.update(patch_size=48, max_patches=32, scales=(0.7, 1.0, 1.4),
                   eval_scales=(0.7, 1.0, 1.4))
    c.train.update(lr=0.007371026193352407, warmup_steps=50, steps=900, writers_per_batch=16)
    for entry in c.evals.values():
      entry.every = c.train.steps
  if a.size == 'hisfrag20':
    full_size(c)
  elif a.size == 'test':
    test_size(c)

  if a.data == 'collection':
    # Any folder of images (retrieval/collections/collection.py): no writer labels, so surrogate
    # classes, and no split to score or to choose the post-processing on, so launch.index
    # uses the settings above (the encoder alone) unless given others.
    c.data.format = 'collection'
    c.train.labels = 'surrogate'
    c.evals = {}
    c.eval.tune_split = ''

  c.lock()
  return c


def get_sweeps(arg='demo'):
  """The sweeps of each variant (bengrapheme/sweep.py; docs/sweeps.md). The demo's recipe is
  chosen on the validation family, scored as the test split of a folder whose train/ is the
  demo's (SRS-LBP's PCA is fitted there):

    mkdir -p data/fragment-family/valfam
    ln -s ../../fragments-valfam/test data/fragment-family/valfam/test
    ln -s ../../fragments-synth/train data/fragment-family/valfam/train
    python -m launch.sweep --config configs/fragments.py:demo --sweep recipe \
        --data data/fragments-synth --workdir workdirs/sweeps/fragments-recipe
  """
  a = defaults.arguments(arg, 'configs/fragments.py', size=SIZES, recipe=RECIPES, data=DATA)
  if (a.size, a.recipe, a.data) == ('demo', 'resnet', 'folder'):
    # 'score': the writer mAP of val's post-processing applied to the family unchanged.
    # P x K at batch 256: 8 x 32, 16 x 16 or 32 x 8.
    return {'recipe': dict(
        space={'train.lr': dict(low=2e-3, high=1.6e-2, log=True),
               'train.warmup_steps': [25, 50, 100, 150],
               'train.steps': [400, 600, 900],
               'train.writers_per_batch': [8, 16, 32],
               'input.patch_size': [32, 48],
               'input.max_patches': [32, 48, 96],
               'input.scales,input.eval_scales': [(1.0,), (0.85, 1.0, 1.2), (0.7, 1.0, 1.4)]},
        choose='valfam', metric='score', every=300, trials=12, sampler='tpe',
        pruner='median', baseline=True,
        evals={'valfam': dict(type='fragments', split='test',
                              data='data/fragment-family/valfam', export_distances=False)})}
  if a.size == 'test':
    return {'smoke': dict(space={'train.lr': [1e-3, 4e-3]}, choose='val', every=3, trials=2,
                          sampler='grid', pruner='median', startup_trials=1)}
  return {}
