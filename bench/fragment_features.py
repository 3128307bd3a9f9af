"""The fragment task's per-fragment work and its end-to-end paths, against the code they
replaced (bench/reference_patches.py, retrieval/features/lbp_host.py), in turns.

  python -m bench.fragment_features [--quick]

- Per-fragment work other than the encoder: decode, area, binarisation, keypoints, patches
  and SRS-LBP of synthetic fragments (retrieval/synthetic/synth.py), as the evaluator and the index
  now run it (retrieval/features/patches.py: each file read once in worker processes, SIFT detection
  only, the rest in the workers on a CPU-only machine or on the device), against the code
  before: a thread pool sized by os.cpu_count(), each fragment decoded, cut by scikit-image's
  Sauvola and OpenCV SIFT (detection and description), decoded again for SRS-LBP. A second
  row runs the device kernels on whatever device this is (on a CPU: the same silicon). The
  patches and SRS-LBP features must be equal.
- The evaluator's work on one split (its patches, their embeddings, its SRS-LBP features and
  those of the train sample its PCA is fitted on), as retrieval/fragments/evaluate.py runs it now,
  against the same steps with the code before (the embedding without the train step's
  compiler options, as before).
- Index build (launch.index: retrieval/collections/index.py's build) against the index's embedding
  before (bench/reference_patches.py: lbp_sample_pca, embed).
- The embedding step alone, patches/s, with the train step's XLA options against XLA's
  defaults: the embeddings must be equal.

On a CPU-only machine the encoder runs on the same cores as everything else, so the
per-fragment row leaves it out.
"""
import os
import sys
import tempfile

import numpy as np

from bench import common

FRAGMENTS = dict(full=dict(writers_train=2, writers_test=12, pages_per_writer=2),
                 quick=dict(writers_train=1, writers_test=3, pages_per_writer=1))
PER_FRAGMENT_TARGET = 10.0
END_TO_END_TARGET = 3.0


def demo_config(data_dir, cache_dir):
  from configs import fragments
  config = fragments.get_config('demo')
  config.unlock()
  # One scale: the code before cut every fragment at its native size alone, so at the demo's
  # three test-time scales the evaluator would do three times its work.
  config.input.update(scales=(1.0,), eval_scales=(1.0,))
  config.eval.update(tune_split='', export_method='configured', power=0.7, fusion_weight=0.25)
  config.data.dir, config.data.cache_dir = data_dir, cache_dir
  return config


def trained_model(config):
  """The demo's encoder with random weights: the same work as trained ones."""
  import jax
  from bengrapheme import parallel, train
  task = train.load_task(config)
  mesh = parallel.make_mesh(config.mesh)
  graphdef, state = train.init_state(config, task, mesh, pretrained=False)
  model = train.trained_model(graphdef, state, mesh, 0)
  jax.block_until_ready(model.variables)
  return model


def per_fragment(config, src):
  """(new, reference) timed callables over every fragment of `src`, each returning
  (patches per fragment, SRS-LBP features)."""
  import concurrent.futures
  from bench import reference_patches
  from retrieval.features import lbp_host
  from retrieval.features import buckets, patches
  from retrieval.fragments import reader
  i = config.input
  names = [os.path.basename(f.path) for f in src.fragments]
  params = dict(size=i.patch_size, max_patches=i.max_patches, ink_bounds=i.ink_bounds,
                seed=config.seed)

  def new():
    out = list(patches.extract_all(src.read_rgb, range(len(src)), names, with_lbp=True,
                                   **params))
    return [e.patches for e in out], np.stack([e.lbp for e in out])

  def reference():
    def one(k):
      rgb = src.read_rgb(k)
      cut, _ = reference_patches.extract(rgb, names[k], **params)
      reader.valid_pixel_count(rgb)
      grey = reader.convert(src.read_rgb(k), color=False)  # decoded again, as before
      return cut, lbp_host.lbp_features(grey)

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
      out = list(pool.map(one, range(len(src))))
    return [c for c, _ in out], np.stack([x for _, x in out])

  return new, reference


def assert_equal(new, old):
  (new_patches, new_lbp), (old_patches, old_lbp) = new, old
  for a, b in zip(new_patches, old_patches):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(new_lbp, old_lbp, rtol=1e-6, atol=1e-7)


def evaluator_split(config, model, tmp):
  """(new, reference) callables doing the evaluator's work on split 'test'."""
  import concurrent.futures
  from bench import reference_patches
  from retrieval.features import lbp_host
  from bengrapheme import inference
  from retrieval.fragments import data, evaluate, reader
  runs = iter(range(10 ** 6))
  i = config.input

  def new():
    config.data.cache_dir = os.path.join(tmp, f'cache{next(runs)}')
    evaluate._lbp_pcas.clear()
    workdir = os.path.join(tmp, f'work{next(runs)}')
    src = data.source(config, workdir, 'test')
    evaluate.patch_embeddings(config, model, src)
    return evaluate.srs_lbp_embeddings(config, workdir, src)

  def reference():
    train, test = data.listing(config, 'train'), data.listing(config, 'test')

    def features(listing, indices):
      with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        return np.stack(list(pool.map(
            lambda k: lbp_host.lbp_features(
                reader.convert(listing.read_rgb(k), color=False)), indices)))

    def cut(k):
      return reference_patches.extract(
          test.read_rgb(k), os.path.basename(test.fragments[k].path), size=i.patch_size,
          max_patches=i.max_patches, ink_bounds=i.ink_bounds, seed=config.seed)[0]

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
      cuts = np.concatenate(list(pool.map(cut, range(len(test)))))
    from retrieval.collections.index import _Patches
    next(inference.outputs_by_source(model, evaluate.embedding_fn(config), [_Patches(cuts)],
                                      batch_size=config.eval.batch_size,
                                      compiler_options=False))
    fit_on = np.random.default_rng(config.seed).permutation(len(train))
    features(train, fit_on[:config.eval.lbp_fit_fragments])
    return features(test, range(len(test)))

  return new, reference


def index_build(config, model, tmp, listing):
  from bench import reference_patches
  from retrieval.collections import index as index_lib
  runs = iter(range(10 ** 6))
  settings = dict(power=0.7, whitening_dims=0, rerank_k=0, fusion_weight=0.25)
  paths = [os.path.join(listing.root, p) for p in listing.paths]
  jobs = [(p, os.path.basename(p)) for p in paths]

  def new():
    index_lib.build(config, model, tmp, listing, os.path.join(tmp, f'index{next(runs)}'))

  def reference():
    fitted, known = reference_patches.lbp_sample_pca(config, paths, config.seed)
    reference_patches.embed(config, model, settings, fitted, jobs, lambda *a: None,
                            lbp_known=known)

  return new, reference


def embedding_step(config, model, src):
  from bengrapheme import inference
  from retrieval.fragments import evaluate

  def run(options):
    return lambda: next(inference.outputs_by_source(
        model, evaluate.embedding_fn(config), [src], batch_size=config.eval.batch_size,
        compiler_options=options))['embedding']

  return run(True), run(False)


def run(quick):
  from retrieval.collections import collection
  from retrieval.fragments import data, reader
  from retrieval.features import buckets, patches
  from retrieval.synthetic import synth
  size = 'quick' if quick else 'full'
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = os.path.join(tmp, 'data')
    synth.write_dataset(data_dir, seed=0, workers=os.cpu_count(), page_size=(700, 1000),
                        **FRAGMENTS[size])
    config = demo_config(data_dir, os.path.join(tmp, 'cache'))
    test = data.listing(config, 'test')
    n = len(test)
    pixels = np.mean([np.prod(reader.decode(f.path).shape[:2]) for f in test.fragments])
    model = trained_model(config)

    new, reference = per_fragment(config, test)
    where = 'device kernels' if buckets.on_device() else 'worker processes'
    # Both sides do the same `count` items a turn: (rate, reference rate, ratio) of a turn.
    rates = lambda new, reference, count=n: lambda t: (count / t[new], count / t[reference],
                                                       t[reference] / t[new])
    turns = common.interleaved({'new': new, 'reference': reference}, common.MIN_REPEATS)
    assert_equal(turns['new'][1], turns['reference'][1])
    rows.append(common.timed_record(
        'fragments: per-fragment work but the encoder', 'fragments/s',
        'the code before (threads, each file decoded twice, SIFT described)', turns,
        rates('new', 'reference'), target=f'>= {PER_FRAGMENT_TARGET:g}x',
        meets=lambda value, ratio: ratio >= PER_FRAGMENT_TARGET,
        note=f'{n} synthetic fragments of {pixels:,.0f} px on average: decode, area, ink, '
             f'keypoints, patches, SRS-LBP, here in {where}; patches and SRS-LBP equal '
             '(asserted)'))
    if not buckets.on_device():  # the kernels an accelerator runs, on this CPU
      with buckets.forced_device():
        best = common.interleaved({'new': new, 'reference': reference}, 1)
      assert_equal(best['new'][1], best['reference'][1])
      kernels = n / best['new'][0]
      rows.append(common.record(
          'fragments: the same with the device kernels on this CPU', kernels, 'fragments/s',
          'the code before', n / best['reference'][0],
          ratio=kernels / (n / best['reference'][0]),
          note='Sauvola, box sums and SRS-LBP as jitted kernels over shape buckets '
               '(compilation included, so one run, no spread; no target); what an '
               'accelerator runs'))

    new, reference = evaluator_split(config, model, tmp)
    turns = common.interleaved({'new': new, 'reference': reference}, common.MIN_REPEATS)
    rows.append(common.timed_record(
        'fragments: the evaluator on one split', 'fragments/s', 'the code before', turns,
        rates('new', 'reference'), target=f'>= {END_TO_END_TARGET:g}x',
        meets=lambda value, ratio: ratio >= END_TO_END_TARGET,
        note=f'{n} test fragments: patches, their embeddings (demo encoder), SRS-LBP of the '
             f'split and of the train sample for its PCA'))

    listing = collection.list_images(os.path.join(data_dir, 'test'))
    new, reference = index_build(config, model, tmp, listing)
    turns = common.interleaved({'new': new, 'reference': reference}, common.MIN_REPEATS)
    rows.append(common.timed_record(
        'index: build rate', 'fragments/s', "the index's embedding before", turns,
        rates('new', 'reference'), target=f'>= {END_TO_END_TARGET:g}x',
        meets=lambda value, ratio: ratio >= END_TO_END_TARGET,
        note=f'{n} synthetic fragments, demo encoder, SRS-LBP fusion'))

    src = data.source(config, os.path.join(tmp, 'work-embed'), 'test')
    ours, xla_default = embedding_step(config, model, src)
    turns = common.interleaved({'ours': ours, 'default': xla_default}, common.MIN_REPEATS)
    np.testing.assert_allclose(turns['ours'][1], turns['default'][1], rtol=1e-4, atol=1e-5)
    rows.append(common.timed_record(
        'fragments: embedding step (demo encoder)', 'patches/s', "XLA's default options",
        turns, rates('ours', 'default', len(src)),
        note=f"{len(src):,} patches, batch {config.eval.batch_size}, the train step's "
             'compiler options; embeddings equal (asserted)'))
  return rows


if __name__ == '__main__':
  sys.exit(common.main(__doc__, run))
