"""The core's config checks: every field of defaults.config() that the trainer reads, checked
by train.load_task before any data work, each refused in one line that names the field's
path, its value and what is allowed (errors.ConfigError).

Hand checks, not pydantic: the allowed values depend on each other and on the run (the devices,
the model's parameters, the optimizer's signature), which a field-by-field schema cannot say.
"""
import difflib
import inspect
import numbers
import re

from bengrapheme import errors

GROUP_KEYS = ('pattern', 'lr_scale', 'frozen_steps')


def _number(path, value, low=None, high=None, low_open=False, high_open=False, integer=False,
            allowed=''):
  kind = numbers.Integral if integer else numbers.Real
  ok = isinstance(value, kind) and not isinstance(value, bool)
  if ok and low is not None:
    ok = value > low if low_open else value >= low
  if ok and high is not None:
    ok = value < high if high_open else value <= high
  if not ok:
    raise errors.ConfigError(f'{path}={value!r}: expected {allowed}')


def _regex(path, pattern, groups=None):
  try:
    compiled = re.compile(pattern)
  except (re.error, TypeError) as e:
    raise errors.ConfigError(f'{path}={pattern!r}: not a regular expression ({e})') from None
  if groups is not None and compiled.groups < groups:
    raise errors.ConfigError(f'{path}={pattern!r}: expected a regular expression with a '
                             '(group) capturing the block number')


def close_to(name, valid):
  """' (did you mean X?)' for the entry of `valid` closest to `name`, or ''."""
  close = difflib.get_close_matches(name, valid, n=1)
  return f' (did you mean {close[0]!r}?)' if close else ''


def keyword_args(path, given, fn, what, taken=()):
  """ConfigError at the first key of `given` that `fn` takes no keyword argument of (or that
  the trainer passes itself: `taken`)."""
  # A class's own __init__: nnx's metaclass hides it behind (*args, **kwargs).
  params = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn).parameters
  if any(p.kind is p.VAR_KEYWORD for p in params.values()):
    return
  valid = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
           and n not in taken and n not in ('self', 'rngs')]
  for key in given:
    if key not in valid:
      raise errors.ConfigError(f'{path}.{key}: {what} takes no argument {key!r}'
                               f'{close_to(key, valid)}; it takes {", ".join(valid)}')


def check_train(config):
  t = config.train
  _number('train.steps', t.steps, 1, integer=True, allowed='a number of steps >= 1')
  _number('train.batch_size', t.batch_size, 1, integer=True, allowed='a batch size >= 1')
  _number('train.lr', t.lr, 0, low_open=True, allowed='a learning rate > 0')
  _number('train.warmup_steps', t.warmup_steps, 0, integer=True,
          allowed='a number of steps >= 0')
  _number('train.final_lr_fraction', t.final_lr_fraction, 0, 1, allowed='a share in [0, 1]')
  _number('train.weight_decay', t.weight_decay, 0, allowed='>= 0 (0: none)')
  _number('train.grad_clip', t.grad_clip, 0, low_open=True,
          allowed='a global gradient norm > 0 (a large number: no clipping)')
  _number('train.ema_decay', t.ema_decay, 0, 1, high_open=True,
          allowed='a decay in [0, 1) (0: no EMA)')
  _number('train.grad_accum_steps', t.grad_accum_steps, 1, integer=True,
          allowed='a number of micro-batches >= 1 (1: none)')
  if t.batch_size % t.grad_accum_steps:
    raise errors.ConfigError(
        f'train.grad_accum_steps={t.grad_accum_steps}: expected a divisor of '
        f'train.batch_size={t.batch_size} (each micro-batch the same size)')
  for name, group in t.groups.items():
    path = f'train.groups.{name}'
    for key in group:
      if key not in GROUP_KEYS:
        raise errors.ConfigError(f'{path}.{key}: not a field of a parameter group'
                                 f'{close_to(key, GROUP_KEYS)}; expected {", ".join(GROUP_KEYS)}')
    missing = [key for key in GROUP_KEYS if key not in group]
    if missing:
      raise errors.ConfigError(f'{path}: no {", ".join(missing)}; a parameter group has '
                               f'{", ".join(GROUP_KEYS)}')
    _regex(f'{path}.pattern', group.pattern)
    _number(f'{path}.lr_scale', group.lr_scale, 0, allowed='a learning-rate factor >= 0')
    _number(f'{path}.frozen_steps', group.frozen_steps, 0, integer=True,
            allowed='a number of steps >= 0')
  d = t.layer_decay
  _number('train.layer_decay.rate', d.rate, 0, 1, low_open=True,
          allowed='a factor in (0, 1] (1: no layer decay)')
  _regex('train.layer_decay.block', d.block, groups=1)
  _regex('train.layer_decay.stem', d.stem)
  _regex('train.layer_decay.top', d.top)
  if t.no_decay:
    _regex('train.no_decay', t.no_decay)
  for flag in ('skip_nonfinite', 'per_chunk_batch_stats'):
    if not isinstance(t[flag], bool):
      raise errors.ConfigError(f'train.{flag}={t[flag]!r}: expected True or False')
  _number('train.log_every', t.log_every, 1, integer=True, allowed='a number of steps >= 1')
  _number('train.checkpoint_every', t.checkpoint_every, 1, integer=True,
          allowed='a number of steps >= 1')
  _number('train.keep_checkpoints', t.keep_checkpoints, 1, integer=True,
          allowed='a number of checkpoints >= 1')
  first, last = (tuple(t.profile_steps) + (None, None))[:2]
  if (len(t.profile_steps) != 2 or not all(isinstance(s, int) for s in (first, last))
      or first < 0 or last < first or (first == 0) != (last == 0)):
    raise errors.ConfigError(f'train.profile_steps={tuple(t.profile_steps)!r}: expected '
                             '(first, last) steps with 1 <= first <= last, or (0, 0): none')


# Examples for the messages: any optax optimizer (a function taking learning_rate) or
# schedule may be named.
OPTIMIZERS = ('adamw', 'adam', 'sgd', 'lamb', 'lion', 'adafactor')
SCHEDULES = ('warmup_cosine_decay_schedule', 'cosine_decay_schedule', 'linear_schedule',
             'constant_schedule', 'warmup_exponential_decay_schedule')


def schedule_fields(schedule, config):
  """The arguments of the optax `schedule` that train.* gives, those its signature has: the
  peak (or start) at train.lr, warm-up over train.warmup_steps, decay over train.steps to
  train.lr x train.final_lr_fraction."""
  t = config.train
  params = inspect.signature(schedule).parameters
  known = dict(init_value=0.0 if 'peak_value' in params else t.lr, peak_value=t.lr,
               value=t.lr, warmup_steps=t.warmup_steps,
               decay_steps=max(t.steps, t.warmup_steps + 1), transition_steps=t.steps,
               end_value=t.lr * t.final_lr_fraction, alpha=t.final_lr_fraction)
  return {k: v for k, v in known.items() if k in params}


def optimizer_fields(opt, config, mask):
  """The arguments of the optax optimizer `opt` that train.* gives, those it takes: weight
  decay (train.weight_decay) and the mask of the parameters it applies to."""
  params = inspect.signature(opt).parameters
  return {k: v for k, v in dict(weight_decay=config.train.weight_decay, mask=mask).items()
          if k in params}


def check_optimizer(config):
  """train.optimizer and train.schedule name optax functions; their arguments fit them."""
  import optax
  t = config.train
  opt = getattr(optax, t.optimizer, None) if isinstance(t.optimizer, str) else None
  if not callable(opt) or 'learning_rate' not in inspect.signature(opt).parameters:
    raise errors.ConfigError(
        f'train.optimizer={t.optimizer!r}: expected the name of an optax optimizer that takes '
        f"a learning_rate{close_to(str(t.optimizer), OPTIMIZERS)}, e.g. "
        f'{", ".join(OPTIMIZERS)}')
  keyword_args('train.optimizer_args', t.optimizer_args, opt, f'optax.{t.optimizer}',
               taken=('learning_rate', *optimizer_fields(opt, config, None)))
  if t.weight_decay and 'weight_decay' not in inspect.signature(opt).parameters:
    raise errors.ConfigError(
        f'train.weight_decay={t.weight_decay}: optax.{t.optimizer} takes no weight_decay; '
        'set --config.train.weight_decay=0, or an optimizer that decays weights (adamw)')
  sched = getattr(optax, t.schedule, None) if isinstance(t.schedule, str) else None
  if not callable(sched) or not t.schedule.endswith('schedule'):
    raise errors.ConfigError(
        f'train.schedule={t.schedule!r}: expected the name of an optax schedule'
        f'{close_to(str(t.schedule), SCHEDULES)}, e.g. {", ".join(SCHEDULES)}')
  keyword_args('train.schedule_args', t.schedule_args, sched, f'optax.{t.schedule}')
  given = {**schedule_fields(sched, config), **t.schedule_args}
  missing = [n for n, p in inspect.signature(sched).parameters.items()
             if p.default is p.empty and n not in given]
  if missing:
    raise errors.ConfigError(f'train.schedule_args: optax.{t.schedule} needs '
                             f'{", ".join(missing)}, which train.* does not give; give '
                             f'it in the config file: c.train.schedule_args = '
                             f'dict({missing[0]}=...)')


def check_mesh(config):
  """The mesh fits the devices, and the batch splits evenly over its batch axes."""
  import jax
  from bengrapheme import parallel
  m = config.mesh
  _number('mesh.fsdp', m.fsdp, 1, integer=True, allowed='a number of devices >= 1')
  if not isinstance(m.data, int) or isinstance(m.data, bool) or not (m.data == -1 or m.data >= 1):
    raise errors.ConfigError(f'mesh.data={m.data!r}: expected a number of devices >= 1, or -1 '
                             '(all devices fsdp does not use)')
  parallel.mesh_shape(m, jax.device_count())
  parallel.check_batch(config.train.batch_size, jax.device_count(), config.train.grad_accum_steps)
  _number('eval.batch_size', config.eval.batch_size, 1, integer=True, allowed='a batch size >= 1')


def check_model_args(config):
  """model.args against the backbone's constructor: a misspelt argument is named with the
  arguments the backbone takes."""
  import importlib
  module = importlib.import_module(f'bengrapheme.models.{config.model.name}')
  keyword_args('model.args', config.model.get('args', {}), module.Model,
               f'the backbone model.name={config.model.name!r}')


def task_module(config):
  """The module config.task names; ConfigError when there is none."""
  import importlib
  import importlib.util
  try:
    found = bool(config.task) and importlib.util.find_spec(config.task) is not None
  except ModuleNotFoundError:  # a parent package that does not exist
    found = False
  if not found:
    raise errors.ConfigError(f'task={config.task!r}: no such module; expected the dotted name '
                             'of a task module (what bengrapheme/protocols.py\'s Task describes)')
  return importlib.import_module(config.task)


def check(config):
  """The core's fields that need no model, before the task's own checks
  (protocols.Validates)."""
  _number('seed', config.seed, 0, 2**32 - 2, integer=True, allowed='an integer in [0, 2**32 - 2]')
  check_train(config)
  check_optimizer(config)
  check_mesh(config)
