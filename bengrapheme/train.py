"""The training loop shared by every task, read top to bottom.

A task is a module named by `config.task` that provides what bengrapheme/protocols.py's
Task names (check_data, train_data, make_model, loss, evaluator, random_batch; optionally
predict); load_task checks it.

The train state is a plain pytree (step, params, model_state, opt_state, ema), so jit
shards it and Orbax checkpoints it with no framework in between.
"""
import contextlib
import json
import os
import re
import time

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from bengrapheme import (checkpoint, console, errors, inference, evaluators, files, logs,
                         parallel, protocols, schema, workdir_lock)
from bengrapheme.models import pytorch_weights


def load_task(config):
  """The task module `config.task`, checked against protocols.Task, with the config checked
  before any data work: the core's fields (bengrapheme/schema.py), the evaluators, the task's
  validate (protocols.Validates) when it has one, then what needs the model's shapes
  (check_model)."""
  task = protocols.check(schema.task_module(config), protocols.Task,
                         f'task module {config.task!r}')
  schema.check(config)
  evaluators.validate(config, task)
  if protocols.implements(task, protocols.Validates):
    task.validate(config)
  check_model(config, task)
  return task


def check_model(config, task):
  """model.args against the backbone's constructor, then, on the model's shapes alone
  (nnx.eval_shape: nothing is computed), its protocol, the parameter patterns and what
  accumulation would do to its batch statistics."""
  schema.check_model_args(config)
  shaped = nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0)))
  protocols.check(shaped, protocols.Model, f'the model of task {config.task!r}')
  check_groups(config, nnx.state(shaped, nnx.Param))
  check_accumulation(config, task, shaped)


def check_accumulation(config, task, model):
  """Gradient caching (a coupled loss, protocols.CoupledLoss) runs each chunk's forward pass
  with its own batch statistics, so with BatchNorm its step is not the full batch's: refused
  unless train.per_chunk_batch_stats accepts that."""
  t = config.train
  if (t.grad_accum_steps > 1 and protocols.implements(task, protocols.CoupledLoss)
      and jax.tree.leaves(nnx.state(model, nnx.BatchStat)) and not t.per_chunk_batch_stats):
    raise errors.ConfigError(
        f'train.grad_accum_steps={t.grad_accum_steps}: model.name={config.model.name!r} has '
        f'BatchNorm, which normalises each of the {t.grad_accum_steps} chunks of '
        f'{t.batch_size // t.grad_accum_steps} rows by its own statistics, so the step is not '
        "the whole batch's; accept that with --config.train.per_chunk_batch_stats=True, or "
        'train without accumulation (--config.train.grad_accum_steps=1)')


# ---------------------------------------------------------------- model and train state


def path_name(path):
  """A parameter's path as the patterns of train.groups and train.layer_decay read it:
  'backbone/blocks/3/attention/kernel'."""
  keys = [getattr(k, 'key', getattr(k, 'idx', None)) for k in path]
  return '/'.join(str(k) for k in keys if k is not None)  # not a Variable's '.value'


def optimizer(config):
  """train.optimizer (an optax name, with train.optimizer_args) on train.schedule (an optax
  schedule's name, with train.schedule_args), after global-norm clipping; the learning rate
  of each parameter group of train.groups scaled, and layer-wise decay (train.layer_decay),
  when asked. The default: AdamW, linear warm-up and cosine decay."""
  t = config.train
  make_schedule = getattr(optax, t.schedule)
  schedule = make_schedule(**{**schema.schedule_fields(make_schedule, config), **t.schedule_args})
  # No weight decay on norm scales and biases (vectors), as is standard for ResNets, nor on
  # the parameters train.no_decay matches (a ViT's position table and class token, say).
  def decay_mask(params):
    def decayed(path, p):
      return p.ndim > 1 and not (t.no_decay and re.fullmatch(t.no_decay, path_name(path)))
    return jax.tree_util.tree_map_with_path(decayed, params)
  opt = getattr(optax, t.optimizer)
  fields = schema.optimizer_fields(opt, config, decay_mask)
  tx = optax.chain(optax.clip_by_global_norm(t.grad_clip),
                   opt(schedule, **fields, **t.optimizer_args))
  if t.groups:
    # Scaling AdamW's update scales a group's learning rate, weight decay included. Only
    # then is it in the chain, so other runs keep their optimizer state's layout. After a
    # frozen start a group warms up over warmup_steps of its own: the shared warm-up may be
    # over by then, and a jump to its full rate would jolt pretrained features with updates
    # shaped by the still-young heads.
    def factor(group):
      def scale(count):
        if not group.frozen_steps:
          return jnp.asarray(group.lr_scale, jnp.float32)
        ramp = (count - group.frozen_steps + 1) / max(t.warmup_steps, 1)
        return group.lr_scale * jnp.clip(ramp, 0.0, 1.0)
      return optax.scale_by_schedule(scale)
    tx = optax.chain(tx, optax.multi_transform(
        {**{name: factor(group) for name, group in t.groups.items()}, 'rest': optax.identity()},
        lambda params: jax.tree_util.tree_map_with_path(
            lambda path, _: group_of(t.groups, path_name(path)), params)))
  if t.layer_decay.rate != 1:
    tx = optax.chain(tx, scale_by_layer(t.layer_decay))
  return tx, schedule


def group_of(groups, name):
  """The first group of train.groups whose pattern matches the whole of `name`, else 'rest'."""
  return next((g for g, spec in groups.items() if re.fullmatch(spec.pattern, name)), 'rest')


def check_groups(config, params):
  """errors.ConfigError when a pattern of train.groups, train.layer_decay or train.no_decay
  matches no parameter of the model (a typo would silently train every parameter alike)."""
  names = [path_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
  patterns = {f'train.groups.{g}.pattern': spec.pattern for g, spec in config.train.groups.items()}
  if config.train.layer_decay.rate != 1:
    patterns['train.layer_decay.block'] = config.train.layer_decay.block
  if config.train.no_decay:
    patterns['train.no_decay'] = config.train.no_decay
  for field, pattern in patterns.items():
    if not any(re.fullmatch(pattern, n) for n in names):
      raise errors.ConfigError(f'{field}={pattern!r} matches no parameter of model.name='
                               f'{config.model.name!r}; its parameters are named like '
                               f'{", ".join(names[:3])}, ...')


def layer_factors(params, spec):
  """{param: rate ** (depth + 1 - layer)}: layer i + 1 a parameter of block i (spec.block's
  first group), layer depth + 1 one matching spec.top or outside spec.stem (the heads),
  layer 0 the rest of the stem (a ViT's patch embedding, position table, class token)."""
  def block(name):
    match = re.fullmatch(spec.block, name)
    return int(match.group(1)) if match else None

  named = jax.tree_util.tree_map_with_path(lambda path, _: path_name(path), params)
  depth = 1 + max(b for b in map(block, jax.tree.leaves(named)) if b is not None)

  def factor(name):
    if block(name) is not None:
      layer = block(name) + 1
    elif re.fullmatch(spec.top, name) or not re.fullmatch(spec.stem, name):
      layer = depth + 1
    else:
      layer = 0
    return spec.rate ** (depth + 1 - layer)
  return jax.tree.map(factor, named)


def scale_by_layer(spec):
  """Layer-wise learning-rate decay (BEiT, Bao et al. 2022; ViT fine-tunes use 0.25-0.9):
  AdamW's update (weight decay included) scaled by layer_factors, so the blocks nearest the
  input, whose pre-trained features are the most general, move least."""
  def update(updates, state, params=None):
    del params
    factors = layer_factors(updates, spec)
    return jax.tree.map(lambda u, f: u * f, updates, factors), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def check_init_from(config, task):
  """MissingWeights when model.init_from names a workdir that does not exist (a training
  run checks it before any data work)."""
  source = config.model.init_from
  if (source and not os.path.splitext(source)[1] and not os.path.exists(source)
      and not files.is_bucket(source)):
    how = (f' ({task.init_from_advice(config)})'
           if protocols.implements(task, protocols.FineTunes) else '')
    raise pytorch_weights.MissingWeights(
        f'model.init_from={source!r}: no such workdir. It names the workdir of the run to '
        f"start from{how}, or a weight file; '' trains from scratch")


def init_state(config, task, mesh, pretrained=True, abstract=False):
  """Builds the sharded train state directly on the devices; returns (graphdef, state).
  With `abstract`, the state's shapes, dtypes and shardings only (nothing is allocated: what
  an ahead-of-time compile for a batch that may not fit needs).

  With `pretrained` and config.model.init_from set, the backbone starts from that PyTorch
  state_dict (bengrapheme/models/pytorch_weights.py) or, when it names a folder, from the
  backbone of that workdir's newest checkpoint (a run of this project, e.g. a pre-training
  for a fine-tune), checked against the model before any device work. A restored
  checkpoint replaces it, so evaluation passes pretrained=False and needs no weight file."""
  tx, _ = optimizer(config)
  shaped = nnx.eval_shape(lambda: task.make_model(config, nnx.Rngs(0)))
  model_def = nnx.graphdef(shaped)
  loaded = None
  if pretrained and config.model.init_from:
    check_init_from(config, task)
    source = config.model.init_from
    if os.path.isdir(source) or (files.is_bucket(source) and not os.path.splitext(source)[1]):
      loaded = checkpoint.backbone_state(source, shaped.backbone)
    else:
      loaded = pytorch_weights.backbone_state(shaped.backbone, source)

  def init(loaded):  # an argument, not a constant folded into the compiled init
    model = task.make_model(config, nnx.Rngs(config.seed))
    if loaded is not None:
      nnx.update(model.backbone, loaded)
    _, params, model_state = nnx.split(model, nnx.Param, ...)
    state = {'step': jnp.zeros((), jnp.int32), 'params': params, 'model_state': model_state,
             'opt_state': tx.init(params),
             # The first step whose loss or gradients were NaN/Inf (-1: none yet).
             'first_nonfinite_step': jnp.full((), -1, jnp.int32)}
    if config.train.ema_decay:
      state['ema'] = params
    # No weak types (a parameter made from a Python float, e.g. GeM's p): the train step's
    # outputs are strongly typed, so a weak input made it compile a second time at step 2.
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype), state)

  shapes = jax.eval_shape(init, loaded)
  shardings = parallel.param_sharding(mesh, shapes)
  if abstract:
    return model_def, jax.tree.map(
        lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        shapes, shardings)
  return model_def, jax.jit(init, out_shardings=shardings)(loaded)


def eval_variables(state):
  """The variables evaluation uses: EMA parameters when kept, else the trained ones."""
  return state.get('ema', state['params']), state['model_state']


# ---------------------------------------------------------------- update step


def make_train_step(config, task, graphdef, mesh, state_shardings):
  tx, schedule = optimizer(config)
  base_key = jax.random.key(config.seed)
  accum = config.train.grad_accum_steps
  coupled = protocols.implements(task, protocols.CoupledLoss)

  def forward(params, model_state, batch, key):
    model = nnx.merge(graphdef, params, model_state, copy=True)
    loss, aux = task.loss(model, batch, key, config)
    _, _, new_model_state = nnx.split(model, nnx.Param, ...)  # e.g. BatchNorm statistics
    return loss, (aux, new_model_state)

  grad_fn = jax.value_and_grad(forward, has_aux=True)

  def embed(params, model_state, batch, key):
    model = nnx.merge(graphdef, params, model_state, copy=True)
    outputs = task.embed(model, batch, key, config)
    _, _, new_model_state = nnx.split(model, nnx.Param, ...)
    return outputs, new_model_state

  def micro_batches(batch):
    """[accum, B / accum, ...]: micro-batch i takes every accum-th row, so each device keeps
    its own rows."""
    return jax.tree.map(
        lambda x: jnp.swapaxes(x.reshape(x.shape[0] // accum, accum, *x.shape[1:]), 0, 1),
        batch)

  def whole_batch(chunks):
    """micro_batches' inverse: the rows back in the batch's order."""
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), chunks)

  def accumulated(params, model_state, batch, key):
    """Micro-batches, each its own loss, the gradients averaged: exact for a loss that is a
    mean over independent rows."""
    def body(carry, xs):
      grads_sum, model_state = carry
      mb, i = xs
      (l, (a, model_state)), g = grad_fn(params, model_state, mb, jax.random.fold_in(key, i))
      return (jax.tree.map(jnp.add, grads_sum, g), model_state), (l, a)

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, model_state), (losses, auxes) = jax.lax.scan(
        body, (zeros, model_state), (micro_batches(batch), jnp.arange(accum)))
    grads = jax.tree.map(lambda g: g / accum, grads)
    return losses.mean(), jax.tree.map(jnp.mean, auxes), model_state, grads

  def cached(params, model_state, batch, key):
    """Gradient caching (Gao et al. 2021) for a loss that couples the rows (P x K metric
    learning, where micro-batches would split the positive pairs): the outputs in chunks
    without gradients, the loss and its gradient with respect to them on the whole batch,
    then each chunk's forward again, backpropagating its share. Equal to the full-batch step
    for a model without batch statistics; a chunk holds the activations of B / accum rows."""
    chunks, indices = micro_batches(batch), jnp.arange(accum)

    def forward(model_state, xs):
      mb, i = xs
      outputs, new_model_state = embed(params, model_state, mb, jax.random.fold_in(key, i))
      return new_model_state, (outputs, model_state)  # and the state the chunk started from

    model_state, (outputs, starts) = jax.lax.scan(forward, model_state, (chunks, indices))
    (loss, aux), cotangents = jax.value_and_grad(
        lambda o: task.batch_loss(o, batch, config), has_aux=True)(whole_batch(outputs))

    def backward(grads_sum, xs):
      mb, i, start, cotangent = xs
      _, pull = jax.vjp(lambda p: embed(p, start, mb, jax.random.fold_in(key, i))[0], params)
      return jax.tree.map(jnp.add, grads_sum, pull(cotangent)[0]), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, _ = jax.lax.scan(backward, zeros,
                            (chunks, indices, starts, micro_batches(cotangents)))
    return loss, aux, model_state, grads

  def train_step(state, batch):
    step = state['step'] + 1
    key = jax.random.fold_in(base_key, step)  # a pure function of the step: resumes exactly
    params = state['params']
    if accum == 1:
      (loss, (aux, model_state)), grads = grad_fn(params, state['model_state'], batch, key)
    else:
      loss, aux, model_state, grads = (cached if coupled else accumulated)(
          params, state['model_state'], batch, key)

    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state['opt_state'], params)
    new = dict(state, step=step, params=optax.apply_updates(params, updates),
               model_state=model_state, opt_state=opt_state)
    if 'ema' in state:
      d = config.train.ema_decay
      new['ema'] = jax.tree.map(lambda e, p: d * e + (1 - d) * p, state['ema'], new['params'])
    if config.train.skip_nonfinite:  # keep the old state, only the step counter moves on
      new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, dict(state, step=step))
    new['first_nonfinite_step'] = jnp.where(
        (state['first_nonfinite_step'] < 0) & ~finite, step, state['first_nonfinite_step'])
    scalars = dict(aux, loss=loss, grad_norm=grad_norm, lr=schedule(step - 1),
                   nonfinite=(~finite).astype(jnp.int32))
    return new, scalars

  return jax.jit(train_step,
                 in_shardings=(state_shardings, parallel.batch_sharding(mesh)),
                 out_shardings=(state_shardings, parallel.replicated(mesh)),
                 donate_argnums=0, compiler_options=parallel.compiler_options())


def state_and_step(config, task, mesh, pretrained=True):
  """(graphdef, sharded train state, jitted train step): what training and launch.train's
  --dry_run both run, so a dry run compiles exactly the step that training would."""
  graphdef, state = init_state(config, task, mesh, pretrained)
  state_shardings = jax.tree.map(lambda x: x.sharding, state)
  return graphdef, state, make_train_step(config, task, graphdef, mesh, state_shardings)


class NonFinite(errors.UserError, FloatingPointError):
  """The loss or gradients went NaN/Inf (the message names the step and what to change)."""


def check_finite(state, config):
  """Stops the run, naming the step, when a loss or gradient went NaN/Inf (unless skipped)."""
  bad = int(jax.device_get(state['first_nonfinite_step']))
  if bad >= 0 and not config.train.skip_nonfinite:
    raise NonFinite(
        f'loss or gradients became NaN/Inf at step {bad}; the last checkpoint before it is '
        'kept intact. Lower train.lr, or set train.skip_nonfinite=True to skip such steps.')


# ---------------------------------------------------------------- logged scalars


@jax.jit
def accumulate(interval, scalars):
  """Adds one step's scalars to the interval's sums on the devices: the log shows the mean
  over the steps since the previous line (not one step's value, which spikes on CutMix
  batches) without a host round trip per step."""
  return {'sum': jax.tree.map(jnp.add, interval['sum'], scalars),
          'loss_max': jnp.maximum(interval['loss_max'], scalars['loss']),
          'steps': interval['steps'] + 1}


def empty_interval(scalars):
  return {'sum': jax.tree.map(jnp.zeros_like, scalars),
          'loss_max': jnp.full_like(scalars['loss'], -jnp.inf), 'steps': jnp.zeros((), jnp.int32)}


def saved_interval(interval):
  """The interval's sums as JSON (exact: a float32 converts to a Python float and back)."""
  values = jax.device_get(interval)
  return {'sum': {k: float(v) for k, v in values['sum'].items()},
          'loss_max': float(values['loss_max']), 'steps': int(values['steps'])}


def carried_interval(saved, scalars):
  """The interval saved with the checkpoint (saved_interval), typed as this run's scalars;
  an empty one if the scalars differ (another config): its first row then covers fewer
  steps."""
  empty = empty_interval(scalars)
  if set(saved['sum']) != set(empty['sum']):
    return empty
  return {'sum': {k: jnp.asarray(saved['sum'][k], v.dtype) for k, v in empty['sum'].items()},
          'loss_max': jnp.asarray(saved['loss_max'], empty['loss_max'].dtype),
          'steps': jnp.asarray(saved['steps'], jnp.int32)}


def interval_means(interval):
  """The logged row: every scalar's mean over the interval, and the largest loss in it."""
  means = {k: float(v) / int(interval['steps']) for k, v in interval['sum'].items()}
  return dict(means, loss_max=float(interval['loss_max']))


# ---------------------------------------------------------------- the loop

STEPS_IN_FLIGHT = 2  # train steps dispatched ahead of the one the host waits for


def train(config, workdir, on_eval=None):
  """Trains `config` in `workdir`, resuming from its newest checkpoint; returns the state.

  Stops early, having saved the current step, on SIGTERM (returns) or Ctrl-C (raises
  errors.Interrupted); whatever ends it, the workdir lock, signal handlers and checkpoint
  manager are released. on_eval(step, name, scores), when given, is called after each
  evaluation during training; what it raises stops training there (a sweep's pruner)."""
  task = load_task(config)
  check_init_from(config, task)
  # Before the workdir is touched: missing data is reported without creating anything.
  task.check_data(config)
  # Before any work: a second run on this workdir stops here, naming the one that holds it.
  workdir_lock.acquire(workdir)
  def stopped_at_once():
    newest = checkpoint.newest_step(workdir)
    kept = f'the newest checkpoint is step {newest}' if newest is not None else 'none saved'
    return f'Interrupted (Ctrl-C), stopped at once: {kept}; rerun the same command to resume.'

  with errors.on_ctrl_c(stopped_at_once), contextlib.ExitStack() as cleanup:
    cleanup.callback(workdir_lock.release, workdir)
    return _train(config, workdir, task, cleanup, on_eval)


def _train(config, workdir, task, cleanup, on_eval):
  mesh = parallel.make_mesh(config.mesh)

  # Input: each process reads its own slice of every shuffled epoch.
  local_batch = parallel.per_process_batch(config.train.batch_size, mesh)
  data = iter(task.train_data(config, workdir, local_batch))

  # Model, optimizer and the jitted step.
  console.say('Initialising the model and its sharded train state...')
  graphdef, state, train_step = state_and_step(config, task, mesh)

  # Resume from the newest checkpoint (state and input position together).
  ckpt = checkpoint.manager(workdir, keep=config.train.keep_checkpoints,
                            every=config.train.checkpoint_every)
  cleanup.callback(ckpt.close)  # waits for a save in flight
  restored_step, restored = checkpoint.restore(ckpt, checkpoint.abstract(state), data)
  # The log interval's sums at the saved step: the resumed run's first row is then the row
  # an uninterrupted run logs.
  carried = None
  if restored is not None:
    state = restored
    carried = checkpoint.saved_log(ckpt, restored_step)
    console.say(f'Resumed from {workdir} at step {restored_step}.')
  elif hasattr(task, 'init_from_data'):  # optional (protocols.DataInit), on a fresh start only
    state = task.init_from_data(config, workdir, graphdef, state, mesh)
  # Made before the first step, so a config with no split to score fails at once (and
  # before config.json, which it would leave behind).
  in_training = evaluators.make(config, task, workdir, evaluators.in_training(config))
  save_config(config, workdir)  # only now: a refused checkpoint keeps its own config.json
  start = int(jax.device_get(state['step']))
  logger = logs.MetricLogger(workdir, resume_step=start)
  cleanup.callback(logger.close)
  progress = console.TrainingProgress(config.train.steps, start, config.train.batch_size)
  cleanup.callback(progress.close)
  # From here on SIGTERM and Ctrl-C mean "save the current step and stop".
  preemption = cleanup.enter_context(checkpoint.Preemption())
  interval = None
  # images/s counts the steps after the first (which compiles) and leaves evaluations out.
  tick, tick_step = None, None
  in_flight = parallel.InFlight(STEPS_IN_FLIGHT)
  first_traced, last_traced = config.train.profile_steps
  tracing = False
  if start < config.train.steps:
    console.say(f'Compiling the train step, then training steps {start + 1:,}-'
                f'{config.train.steps:,}...')
  began = time.perf_counter()
  for step in range(start + 1, config.train.steps + 1):
    if step == first_traced:
      jax.profiler.start_trace(os.path.join(workdir, 'profile'))
      tracing = True
    batch = parallel.global_batch(mesh, next(data))
    state, scalars = train_step(state, batch)
    if interval is None:
      interval = (carried_interval(carried, scalars) if carried else empty_interval(scalars))
      carried = None
    interval = accumulate(interval, scalars)
    # Dispatch is asynchronous: unchecked, the host runs a whole log interval ahead of the
    # devices (its progress and ETA then stall at every log line) holding every batch in
    # flight. A few steps in flight keep the devices busy.
    in_flight.push(scalars['loss'])
    if step == start + 1:  # one wait, so that steady-state timing starts after compilation
      jax.block_until_ready(scalars)
      console.say(f'Compiled and ran step {step:,} in {time.perf_counter() - began:.1f} s.')
      progress.start_steady()
      tick, tick_step = time.perf_counter(), step
    if tracing and step == last_traced:
      jax.block_until_ready(state)
      jax.profiler.stop_trace()  # open WORKDIR/profile in TensorBoard's profile tab or Perfetto
      tracing = False

    logged = None
    if step % config.train.log_every == 0 or step == config.train.steps:
      check_finite(state, config)
      logged = interval_means(jax.device_get(interval))
      interval = None
      now = time.perf_counter()
      if step > tick_step:  # else only the compiling step ran since the last row
        logged['images_per_s'] = (step - tick_step) * config.train.batch_size / (now - tick)
      tick, tick_step = now, step
      logger.write(step, logged)
    progress.update(step, loss=logged['loss'] if logged else None)

    preempted = preemption.reached(ckpt, step)
    if step % config.train.checkpoint_every == 0 or step == config.train.steps or preempted:
      check_finite(state, config)  # never save a state that went NaN
      checkpoint.save(ckpt, step, state, data, force=step == config.train.steps or preempted,
                      log=None if interval is None else saved_interval(interval))
    if preempted:
      ckpt.wait_until_finished()
      if preemption.interrupted:
        raise errors.Interrupted(f'Interrupted: saved step {step}; rerun the same command to '
                                 'resume.')
      console.say(f'Preempted: saved step {step}; rerun the same command to resume.',
                  every_process=True)
      break

    due = evaluators.due(config, list(in_training), step)
    if due:
      model = trained_model(graphdef, state, mesh, step, task)

      def log(name, evaluator, scores, details):
        del details
        logger.write(step, inference.flatten({name: scores}))
        console.say(f'step {step:,} {name}: {evaluator.headline(scores)}')
        if on_eval:
          on_eval(step, name, scores)
      with progress.paused():
        console.say(f'Evaluating {", ".join(due)} at step {step:,}...')
        evaluators.run(config, {n: in_training[n] for n in due}, model, log)
      tick, tick_step = time.perf_counter(), step

  ckpt.wait_until_finished()
  return state


# ---------------------------------------------------------------- shared with eval_only.py


def save_config(config, workdir):
  """Records the config beside the checkpoints, for evaluate / predict and for people."""
  if jax.process_index() == 0:
    files.write_atomic(files.join(workdir, 'config.json'), config.to_json_best_effort(indent=2))


def read_config(workdir):
  """The config save_config recorded in `workdir` (locked, as a config file's), or None."""
  text = files.read_text(files.join(workdir, 'config.json'))
  if text is None:
    return None
  def tuples(value):  # JSON has lists only; configs hold their sequences as tuples
    if isinstance(value, dict):
      return {k: tuples(v) for k, v in value.items()}
    return tuple(map(tuples, value)) if isinstance(value, list) else value
  config = ml_collections.ConfigDict(tuples(json.loads(text)))
  config.lock()
  return config


def trained_model(graphdef, state, mesh, step, task=None):
  """The inference.TrainedModel of a train state: the model in eval mode as pure functions
  of its variables (what evaluators jit), with the evaluation variables; its features are
  the task's (protocols.Features), when it says what they are."""
  def apply(variables, images):
    return nnx.merge(graphdef, *variables)(images, train=False)

  features = None
  if task is not None and protocols.implements(task, protocols.Features):
    def features(variables, images):
      return task.features(nnx.merge(graphdef, *variables), images)
  return inference.TrainedModel(apply, eval_variables(state), mesh, step, features)
