"""The evaluators of a run, chosen by name in the config as big_vision's and kauldron's are.

  config.evals.NAME = dict(type=..., split=NAME, every=0, **settings)

  type      the evaluator: a name in the task module's EVALUATORS, or 'package.module:Name'
            for any other (another task's evaluator where its inputs fit). It is called as
            type(config, split, workdir).
  split     the data split it scores (by default the entry's NAME).
  data      another dataset folder whose split it scores (by default config.data.dir): a
            validation family kept apart from the run's own data, say.
  every     during training, every this many steps and at the last step; 0: never (it
            still runs in launch.evaluate).
  settings  any other key: a setting for this evaluator alone, either a field of the shared
            config.eval (its batch size, ...) or one of the evaluator's own SETTINGS (a dict
            of names and defaults on its class or function), which no other config needs.

Scores are logged and written under NAME. config.eval.tune_split names the entry whose
evaluation chooses the post-processing settings (its scores' 'tuned_settings'); every other
evaluator of the same round applies that choice (reported as 'tuned'), so nothing is ever
chosen on the split it is reported on. A round that runs any evaluator runs the tuning one
with it, on the same checkpoint. '' chooses nothing: the config's own settings apply.
"""
import importlib

from bengrapheme import console, errors, inference, protocols

ENTRY_KEYS = ('type', 'split', 'every', 'data')


def factory(config, task, name):
  """The evaluator class or function that config.evals.NAME's type names."""
  path = f'evals.{name}.type'
  kind = config.evals[name].get('type', '')
  if ':' in kind:
    module, attr = kind.split(':', 1)
    try:
      found = getattr(importlib.import_module(module), attr, None)
    except ImportError as e:
      raise errors.ConfigError(f'{path}={kind!r}: cannot import {module} ({e})') from None
    if found is None:
      raise errors.ConfigError(f'{path}={kind!r}: {module} has no {attr}')
    return found
  known = getattr(task, 'EVALUATORS', {})
  if kind not in known:
    raise errors.ConfigError(f'{path}={kind!r}: expected one of '
                             f'{", ".join(map(repr, known))} (task {config.task}\'s '
                             "EVALUATORS) or 'package.module:Name'")
  return known[kind]


def validate(config, task):
  """ConfigError at the first entry of config.evals, or eval.tune_split, that cannot run."""
  for name, entry in config.evals.items():
    factory(config, task, name)
    every = entry.get('every', 0)
    if not isinstance(every, int) or every < 0:
      raise errors.ConfigError(f'evals.{name}.every={every!r}: expected a number of steps '
                               '>= 0 (0: only in launch.evaluate)')
    if not isinstance(entry.get('split', name), str):
      raise errors.ConfigError(f'evals.{name}.split={entry.split!r}: expected a split name')
    own = getattr(factory(config, task, name), 'SETTINGS', {})
    unknown = [k for k in entry if k not in ENTRY_KEYS and k not in config.eval and k not in own]
    if unknown:
      raise errors.ConfigError(
          f'evals.{name}.{unknown[0]}: not a field of config.eval, which has '
          f'{", ".join(config.eval)}, nor a setting of its evaluator'
          f'{" (" + ", ".join(own) + ")" if own else ""}')
  tune = config.eval.get('tune_split', '')
  if tune and tune not in config.evals:
    raise errors.ConfigError(f'eval.tune_split={tune!r}: expected one of config.evals '
                             f'({", ".join(map(repr, config.evals)) or "none"}) or \'\'')
  if tune and config.evals[tune].get('split', tune) == 'test':
    raise errors.ConfigError(f"eval.tune_split={tune!r}: its split is 'test'; settings are "
                             'never chosen on test (name a validation split\'s entry, or \'\')')


def own_config(config, name, made):
  """config with config.eval updated by the evaluator's own SETTINGS (of the factory `made`),
  then by the entry's settings: what its evaluator reads."""
  own = config.copy_and_resolve_references()
  with own.unlocked():
    own.eval.update({k: v for k, v in getattr(made, 'SETTINGS', {}).items()
                     if k not in own.eval})
    own.eval.update({k: v for k, v in config.evals[name].items() if k not in ENTRY_KEYS})
  if config.evals[name].get('data'):
    own.data.dir = config.evals[name].data
  return own


def make(config, task, workdir, names=None, skipped=None):
  """{name: evaluator} for `names` (default: every entry of config.evals), leaving out,
  saying so (and with the reason in `skipped`), those whose split has no labels, as
  Kaggle's test split; at least one stays."""
  names = list(config.evals) if names is None else list(names)
  found = {}
  for name in names:
    split = config.evals[name].get('split', name)
    try:
      make = factory(config, task, name)
      made = make(own_config(config, name, make), split, workdir)
      found[name] = protocols.check(made, protocols.Evaluator, f'evaluator evals.{name}')
    except inference.Unlabelled as e:
      console.say(f'Skipping {e}')
      if skipped is not None:
        skipped[name] = str(e)
  if names and not found:
    if protocols.implements(task, protocols.Labels) and task.unscorable(config, names):
      raise errors.UserError(task.unscorable(config, names))
    raise errors.UserError(f'config.evals {", ".join(names)}: no split has labels to score; '
                           'add one that does (e.g. val)')
  tune = config.eval.tune_split
  if tune in names and tune not in found:
    raise errors.UserError(f'eval.tune_split={tune!r}: its split has no labels to choose the '
                           "post-processing on; name another entry, or '' for none")
  return found


def in_training(config):
  """The entries that run during training (every > 0), with the tuning one when any does."""
  names = [n for n, entry in config.evals.items() if entry.get('every', 0)]
  tune = config.eval.tune_split
  if names and tune and tune not in names:
    names.insert(0, tune)
  return names


def due(config, names, step):
  """The entries of `names` that evaluate at `step`: their schedule's steps and the last one,
  with the tuning entry whenever another is due."""
  last = step == config.train.steps
  tune = config.eval.tune_split
  chosen = [n for n in names
            if last or (config.evals[n].get('every', 0) and step % config.evals[n].every == 0)]
  if chosen and tune in names and tune not in chosen:
    chosen.insert(0, tune)
  return chosen


def run(config, evaluators, model, on_result):
  """Runs every evaluator on `model`, the tuning one (eval.tune_split) first and its choice
  passed to the others, calling on_result(name, evaluator, scores, details) after each (so
  one's details are let go before the next runs)."""
  tune = config.eval.tune_split
  chosen = None
  for name in sorted(evaluators, key=lambda n: n != tune):
    evaluator = evaluators[name]
    console.say(f'Scoring {name!r}...')
    if name == tune:
      scores, details = evaluator.run(model, tune=True)
      chosen = scores.get('tuned_settings')
    else:
      scores, details = evaluator.run(model, chosen=chosen)
    on_result(name, evaluator, scores, details)
