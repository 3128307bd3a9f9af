"""Historical fragment retrieval (ICFHR 2020 HisFrag20): a triplet-trained fragment encoder.

DATA holds train/ and test/ folders of WID_PID_FID.jpg fragments (the HisFrag20 layout).

  # CPU demo on synthetic writers (make demo-fragments runs all of it):
  python -m retrieval.synth --out data/fragments-synth --writers-train 60 --writers-test 30 \
      --pages-per-writer 4 --seed 0 --workers 2
  python -m launch.train --config configs/fragments.py:demo --data data/fragments-synth \
      --workdir workdirs/fragments-demo
  python -m launch.evaluate --config configs/fragments.py:demo --data data/fragments-synth \
      --workdir workdirs/fragments-demo
  # The real HisFrag20 folders, on accelerators:
  python -m launch.train --config configs/fragments.py:hisfrag20 --data /data/hisfrag20 \
      --workdir gs://bucket/fragments
"""
import ml_collections

from bengrapheme import train


def get_config(arg='demo'):
  if arg not in ('demo', 'hisfrag20', 'test'):
    raise ValueError(f'configs/fragments.py:{arg}: expected one of demo, hisfrag20, test')
  c = train.default_config()  # the trainer's fields; what follows is this task's
  c.task = 'retrieval.task'
  # data.dir holds train/ and test/; format='tfds' reads retrieval/tfds_hisfrag20.py's build.
  c.data.format = 'folder'
  # Fragments are fitted (aspect kept, black padding) into load_size squares once; training
  # sees random crop_size crops, evaluation the whole fitted fragment. 512 keeps the demo's
  # fragments near their own scale (writer mAP 0.249 vs 0.212 when fitted into 256).
  c.input = dict(load_size=512, crop_size=128, color=False, num_threads=8)
  c.model = dict(
      name='resnet', args=dict(depth=10, width=16, stem='imagenet', dtype='float32'),
      pooling='gem', netvlad_clusters=16, embedding_dim=128)
  # Trained from scratch, batch-hard triplets collapsed every embedding to one point on the
  # synthetic demo (loss -> log 2, writer mAP 0.15 at step 300); multi-similarity, whose
  # negative term punishes that, learns. `--config.loss.name=batch_hard` (soft margin unless
  # `--config.loss.margin=0.2`) suits a pretrained trunk.
  c.loss = dict(name='multi_similarity',
                margin=ml_collections.FieldReference(None, field_type=float))
  # Handwriting slant and size identify writers: only mild geometric jitter, no mixing.
  c.aug.update(rotate_deg=3.0, shear_deg=0.0, scale=(0.9, 1.1), translate=0.0,
               grid_mask_prob=0.0, mix_prob=0.0)
  # P x K batches: writers_per_batch writers, batch_size / writers_per_batch fragments each.
  c.train.update(steps=600, batch_size=64, lr=1e-3, warmup_steps=50, log_every=25,
                 checkpoint_every=100)
  c.train.writers_per_batch = 16
  # pca_whitening: dims of a PCA-whitening fitted on the train embeddings (0 = off); the
  # evaluator then also reports 'encoder_whitened'. Off by default: fitted on the demo's 60
  # train writers it halved writer mAP (0.194 vs 0.435 at 2,000 steps with 64 dims).
  c.eval.update(every=300, splits=('test',), batch_size=32)
  c.eval.update(srs_lbp=True, lbp_fit_fragments=1000, export_distances=True, pca_whitening=0)

  if arg == 'hisfrag20':
    # ResNet-50 trunk in colour at higher resolution, bf16, EMA; P x K = 64 writers x 4.
    c.input.update(load_size=512, crop_size=256, color=True)
    c.model.args = dict(depth=50, width=64, stem='imagenet', dtype='bfloat16')
    c.model.embedding_dim = 512
    c.train.update(steps=30000, batch_size=256, writers_per_batch=64, lr=3e-4,
                   warmup_steps=1000, ema_decay=0.999, log_every=100, checkpoint_every=1000)
    c.eval.update(every=5000, batch_size=128, lbp_fit_fragments=5000)
  elif arg == 'test':
    c.input.update(load_size=64, crop_size=48, num_threads=2)
    c.model.args = dict(depth=10, width=8, stem='imagenet', dtype='float32')
    c.model.embedding_dim = 16
    c.train.update(steps=6, batch_size=16, writers_per_batch=4, warmup_steps=2, log_every=2,
                   checkpoint_every=2, keep_checkpoints=10)
    c.eval.update(every=0, batch_size=16, lbp_fit_fragments=40, pca_whitening=8)

  c.lock()
  return c
