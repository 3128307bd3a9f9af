"""The seam between the trainer and a task's evaluators, and the one loop every evaluator runs.

The trainer (or launch.evaluate / launch.predict) restores a checkpoint into a `TrainedModel`:
pure functions of the variables in eval mode (the model, and its backbone's pooled features),
the variables (EMA parameters when kept) and the mesh. bengrapheme/evaluators.py makes the
evaluators config.evals names; bengrapheme/protocols.py's Evaluator says what each provides.

Evaluators feed their split through `outputs_by_row`, which runs a jitted function over
every example exactly once on the whole mesh and hands back host arrays in the source's row
order; what a score needs can instead be summed on the devices as the batches pass
(`sums`), and travel as totals alone. Scores stay nested; `flatten` makes the 'a/b/c' keys
that logs and metrics.json use.
"""
import gc
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bengrapheme import console, input as input_lib, parallel


class Unlabelled(ValueError):
  """A split has no labels to score (Kaggle's test.csv has none): the trainer and
  launch.evaluate skip it, saying why, and score the others."""


class TrainedModel(NamedTuple):
  apply: Callable  # (variables, images) -> model outputs, eval mode; jittable
  variables: Any  # (params, model_state) pytree on the mesh
  mesh: jax.sharding.Mesh
  step: int  # the checkpoint's step
  # (variables, images) -> [B, D] the task's features (protocols.Features; None when it has
  # none): what a probe of the backbone reads. model._replace(apply=features) runs it
  # through outputs_by_row.
  features: Callable = None


def outputs_by_row(model, predict, source, *, batch_size, keys=('image',), what=None,
                   sums=None):
  """Runs `predict(forward, batch)` over every example of `source` once.

  forward(images) applies the model; batch holds the source's fields `keys` and 'mask' for
  one global batch (padding rows included, mask False: their outputs are dropped). predict
  returns a dict of arrays with a leading batch axis. Returns that dict as host numpy arrays
  [len(source), ...], row i from source[i]. Outputs stay on the devices until the last
  batch, then travel once.
  what: shows progress under this name (bengrapheme/console.py).
  sums: a pytree of zero arrays to add each batch's counts to, on the devices: predict then
  returns (outputs, counts), counts shaped like sums, with padding rows counting nothing.
  Returns (rows, totals): totals over the whole source as host numpy arrays. The jitted step
  adds the counts of rows sharded over the whole mesh into replicated totals, so on a mesh
  of several processes they are summed across processes without gathering a row.
  """
  return next(outputs_by_source(model, predict, [source], batch_size=batch_size, keys=keys,
                                what=what, sums=sums))


def outputs_by_source(model, predict, sources, *, batch_size, keys=('image',), what=None,
                      compiler_options=True, sums=None):
  """outputs_by_row for each of `sources` in turn (a generator: a source may be made only
  when its turn comes, e.g. a window of a file read on demand), compiled once for all, with
  the train step's compiler options (compiler_options=False: XLA's defaults, which
  bench/fragment_features.py measures against); with `sums`, yields (rows, totals)."""
  mesh = model.mesh

  def step(variables, totals, batch):
    outputs = predict(lambda images: model.apply(variables, images), batch)
    if totals is not None:
      outputs, counts = outputs
      totals = jax.tree.map(jnp.add, totals, counts)
    return (outputs, batch['index'], batch['mask']), totals

  # Replicated outputs: every process can read every row, even on a multi-host mesh.
  step = jax.jit(step, out_shardings=parallel.replicated(mesh), donate_argnums=1,
                 compiler_options=parallel.compiler_options() if compiler_options else None)
  # A mesh of this process's devices alone (process_local) reads the whole source itself.
  alone = {d.process_index for d in mesh.devices.flat} == {jax.process_index()}
  process_index, process_count = (0, 1) if alone else (jax.process_index(), jax.process_count())
  local_batch = batch_size if alone else parallel.per_process_batch(batch_size, mesh)
  for source in sources:
    results, in_flight = [], parallel.InFlight()
    totals = None if sums is None else jax.device_put(sums, parallel.replicated(mesh))
    progress = console.Progress(len(source), what, unit='example')
    for batch in input_lib.eval_batches(source, batch_size=local_batch,
                                        process_index=process_index,
                                        process_count=process_count):
      batch = parallel.global_batch(mesh, {k: batch[k] for k in (*keys, 'index', 'mask')})
      outputs, totals = step(model.variables, totals, batch)
      results.append(outputs)
      in_flight.push(results[-1])
      progress.update(min(batch_size, len(source) - progress.done))
    progress.close()
    rows, filled = None, np.zeros(len(source), bool)
    for outputs, index, mask in jax.device_get(results):
      if rows is None:
        rows = {k: np.zeros((len(source), *v.shape[1:]), v.dtype) for k, v in outputs.items()}
      for k, v in outputs.items():
        rows[k][index[mask]] = v[mask]
      filled[index[mask]] = True
    if not filled.all():
      raise RuntimeError(f'{(~filled).sum()} of {len(source)} examples got no output')
    # Released before the next one is made. grain's batched dataset holds the source in a
    # reference cycle (BatchMapDataset caches a lambda of itself), which only the cyclic
    # collector frees, and big numpy buffers do not make it run: without this, every window
    # of a streamed test set stayed in memory (8.3 GB peak for 200,840 images).
    del source
    gc.collect()
    yield rows if sums is None else (rows, jax.device_get(totals))


def process_local(model):
  """The TrainedModel on a mesh of this process's devices alone, its variables gathered from
  the whole job (a collective: every process calls it): each process can then run its own
  share of the work (launch.index) without waiting on the others at every batch."""
  if jax.process_count() == 1:
    return model
  from jax.experimental import multihost_utils
  variables = multihost_utils.process_allgather(model.variables, tiled=True)
  devices = np.array(jax.local_devices()).reshape(-1, 1)
  mesh = jax.sharding.Mesh(devices, ('data', 'fsdp'))
  return model._replace(variables=jax.device_put(variables, parallel.replicated(mesh)),
                        mesh=mesh)


def flatten(scores, prefix=''):
  """{'a': {'b': 1.0}} -> {'a/b': 1.0}: the keys logs and metrics.json use."""
  flat = {}
  for key, value in scores.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}/'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat
