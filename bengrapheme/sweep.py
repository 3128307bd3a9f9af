"""Sweeps: the settings a config declares worth trying, each trial an ordinary run, the choice
made on a validation split by Optuna (launch/sweep.py is the command).

A config file declares its sweeps beside its recipes, as kauldron's sweep functions and
big_vision's get_hyper do: `get_sweeps(arg)` returns {name: declaration} for the variant
`arg` (the one get_config takes). A declaration is plain data:

  space      {config path: values}. A list is a set of choices (a grid's axis; categorical for
             TPE); dict(low=, high=, log=False) a range (ints: integers) for TPE. A key of
             several paths joined by ',' sets each to the same value ('input.scales,
             input.eval_scales').
  choose     the config.evals entry whose scores choose; never the run's own test split.
  metric     the key of its scores that chooses, flat as the logs write it ('score',
             'tuned/writer/map').
  direction  'maximize' or 'minimize'.
  every      its evaluations during training, every this many steps and at the last: what
             the pruner reads (the other entries do not run during a trial, test included).
  trials     how many trials (a grid: at most its size).
  sampler    'tpe' or 'grid' (every value of a list space, each combination once).
  pruner     'median' (stop a trial whose evaluation falls below the median of the earlier
             trials' at that step), 'hyperband', or '' (none).
  startup_trials  trials that finish before the median pruner prunes and before TPE models
             (random choices until then); default 4.
  evals      entries added to config.evals for the trials (e.g. the fragment validation
             family: a folder of its own, read through the entry's `data`).

Each trial trains in W/trials/NNN, its config.json, checkpoints, lock and metrics those of any
run. The study (Optuna's journal file W/sweep/journal.log, or an RDB URL) is shared by every
process working on the sweep; a trial is claimed under W/sweep/claim.lock and held through
an flock (W/sweep/claims/NNN.lock), so a trial left running by a process that died (its
lock free) is resumed from its checkpoint by the next process that looks. What it leaves in
W/sweep: trials.csv, report.html (the table and the metric against each parameter),
chosen.flags (the chosen trial's settings, for `launch.train --flagfile`), record.json,
and with report_test, test.json.
"""
import csv
import datetime
import importlib.util
import io
import itertools
import json
import math
import os
import platform
import socket
import subprocess
import time

import filelock
import jax
import matplotlib
import optuna
from matplotlib.figure import Figure

from bengrapheme import console, errors, files, inference, report, train

KEYS = ('space', 'choose', 'metric', 'direction', 'every', 'trials', 'sampler', 'pruner',
        'startup_trials', 'evals', 'baseline')
DEFAULTS = dict(metric='score', direction='maximize', sampler='tpe', pruner='median',
                startup_trials=4, evals={}, baseline=False)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Stopped(errors.UserError):
  """The trial in progress was preempted (SIGTERM) and saved: rerun to resume."""


# ---------------------------------------------------------------- the declaration


def declared(config_arg, name):
  """The declaration `name` of the config file and variant `config_arg`
  ('configs/fragments.py:demo'), its defaults filled in."""
  path, _, arg = config_arg.partition(':')
  spec = importlib.util.spec_from_file_location('_swept_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  sweeps = module.get_sweeps(arg) if hasattr(module, 'get_sweeps') else {}
  if name not in sweeps:
    raise errors.ConfigError(
        f'--sweep {name}: {config_arg} declares ' +
        (f'the sweeps {", ".join(sweeps)}' if sweeps else
         'no sweep (a get_sweeps(arg) function beside get_config; bengrapheme/sweep.py)'))
  unknown = [k for k in sweeps[name] if k not in KEYS]
  if unknown:
    raise errors.ConfigError(f'sweep {name!r} of {config_arg}: no field {unknown[0]!r}; '
                             f'its fields: {", ".join(KEYS)}')
  return dict(DEFAULTS, **sweeps[name], name=name)


def check(sweep, config):
  """ConfigError, in one line before any work, for a declaration that cannot run on `config`
  (the trials' config, sweep['evals'] added): a path that is no field, a value its field
  cannot hold, a sampler or pruner unknown, and a choice made on the run's own test split."""
  where = f'sweep {sweep["name"]!r}'
  for field, allowed in (('direction', ('maximize', 'minimize')), ('sampler', ('tpe', 'grid')),
                         ('pruner', ('median', 'hyperband', ''))):
    if sweep[field] not in allowed:
      raise errors.ConfigError(f'{where}: {field}={sweep[field]!r}; expected one of '
                               f'{", ".join(map(repr, allowed))}')
  for field in ('every', 'trials'):
    if not isinstance(sweep.get(field), int) or sweep[field] < 1:
      raise errors.ConfigError(f'{where}: {field}={sweep.get(field)!r}; expected a whole '
                               'number >= 1')
  if not sweep.get('space'):
    raise errors.ConfigError(f'{where}: space is empty; expected {{config path: values}}')
  for key, values in sweep['space'].items():
    if isinstance(values, dict):
      if sweep['sampler'] == 'grid' or set(values) - {'low', 'high', 'log'}:
        raise errors.ConfigError(f'{where}: space[{key!r}]={values!r}; expected a list of '
                                 'values' + ('' if sweep['sampler'] == 'grid' else
                                             ' or dict(low=, high=, log=False)'))
      values = [values['low'], values['high']]
    elif not isinstance(values, list) or not values:
      raise errors.ConfigError(f'{where}: space[{key!r}]={values!r}; expected a list of '
                               'values or dict(low=, high=, log=False)')
    for path in key.split(','):
      for value in values:
        try:
          set_field(config.copy_and_resolve_references(), path, value)
        except (KeyError, AttributeError, TypeError, ValueError) as e:
          raise errors.ConfigError(f'{where}: space[{key!r}]: config.{path} cannot take '
                                   f'{value!r} ({e})') from None
  if sweep['baseline']:
    baseline_params(sweep, config)  # the config's own values must lie in the space
  choose = sweep.get('choose')
  if choose not in config.evals:
    raise errors.ConfigError(f'{where}: choose={choose!r}; expected an entry of config.evals '
                             f'({", ".join(config.evals)}) or of the sweep\'s evals')
  entry = config.evals[choose]
  if entry.get('split', choose) == 'test' and not entry.get('data'):
    raise errors.ConfigError(
        f"{where}: choose={choose!r} scores the run's own test split; settings are never "
        "chosen on test: choose on a validation split (e.g. 'val') or on another folder "
        "(an entry with data='FOLDER')")
  if entry.get('data') and not os.path.isdir(entry.data):
    raise errors.ConfigError(f'{where}: evals.{choose}.data={entry.data!r}: no such folder; '
                             'expected the dataset folder it chooses on (write it first: the '
                             "config's get_sweeps says how)")


def baseline_params(sweep, config):
  """The trial of the config's own settings (optuna's params), trial 0 of a sweep declared
  with baseline=True: the table then shows whether any setting it tries beats today's."""
  params = {}
  for key, values in sweep['space'].items():
    path = key.split(',')[0]
    value = errors.field(config, path)
    value = tuple(value) if isinstance(value, (list, tuple)) else value
    if isinstance(values, dict):
      inside = values['low'] <= value <= values['high']
    else:
      inside = value in values
    if not inside:
      raise errors.ConfigError(f'sweep {sweep["name"]!r}: baseline=True, but config.{path}='
                               f'{value!r} lies outside space[{key!r}]={values!r}; widen the '
                               'space or drop the baseline')
    params[key] = value if isinstance(values, dict) else labels(values)[values.index(value)]
  return params


def set_field(config, path, value):
  node = config
  *parents, last = path.split('.')
  for key in parents:
    node = node[key]
  if last not in node:
    raise KeyError(f'no field {last!r}')
  node[last] = value


def distributions(sweep):
  """{param name: optuna distribution}; a list's values are their index's label."""
  found = {}
  for key, values in sweep['space'].items():
    if isinstance(values, dict):
      ints = all(isinstance(values[k], int) for k in ('low', 'high'))
      kind = optuna.distributions.IntDistribution if ints else \
          optuna.distributions.FloatDistribution
      found[key] = kind(values['low'], values['high'], log=values.get('log', False))
    else:
      found[key] = optuna.distributions.CategoricalDistribution(labels(values))
  return found


def labels(values):
  """Optuna's choices are numbers or strings: a tuple (the scales) becomes its repr."""
  return [v if isinstance(v, (int, float, str, bool)) or v is None else repr(v)
          for v in values]


def values_of(sweep, params):
  """{config path: value} that a trial's params (optuna's) set."""
  out = {}
  for key, param in params.items():
    values = sweep['space'][key]
    value = values[labels(values).index(param)] if isinstance(values, list) else param
    for path in key.split(','):
      out[path] = value
  return out


def trial_config(base, sweep, settings, workdir):
  """The config a trial trains: `base`, the sweep's evals added, `settings` {path: value}
  set; only the choosing entry (and the tuning one with it) evaluates during training."""
  config = base.copy_and_resolve_references()
  with config.unlocked():
    for name, entry in sweep['evals'].items():
      config.evals[name] = entry
    for name, entry in config.evals.items():
      entry.every = sweep['every'] if name == sweep['choose'] else 0
    if not config.data.get('cache_dir'):  # the prepared data, once for every trial
      config.data.cache_dir = os.path.join(workdir, 'prepared')
  for path, value in settings.items():
    set_field(config, path, value)
  return config


def flag_lines(settings):
  """--config.PATH=VALUE lines that set `settings` in launch.train (absl's --flagfile: a
  line is one argument, so nothing is quoted; ml_collections parses VALUE by the field's
  type)."""
  return [f'--config.{path}={value}' for path, value in settings.items()]


# ---------------------------------------------------------------- the study


def storage(workdir, url):
  """An RDB URL (sqlite:///..., postgresql://...) as given; else Optuna's journal file in
  W/sweep, which many processes on one machine or a shared disk can append to."""
  if url:
    return url
  path = os.path.join(workdir, 'sweep', 'journal.log')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))


def study(sweep, workdir, url, identity, base=None):
  """The sweep's study, made on first use; refused when W's study was made for another
  config, sweep or space (two sweeps would mix their trials)."""
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  # No seed: processes sharing the study would draw the same random trials. A grid is its
  # combinations queued in the study once (Optuna's GridSampler stops a study only from
  # inside study.optimize, which a resumable sweep does not use).
  sampler = optuna.samplers.TPESampler(n_startup_trials=sweep['startup_trials'])
  pruner = {'median': lambda: optuna.pruners.MedianPruner(
                n_startup_trials=sweep['startup_trials']),
            'hyperband': lambda: optuna.pruners.HyperbandPruner(
                min_resource=sweep['every'], reduction_factor=3),
            '': optuna.pruners.NopPruner}[sweep['pruner']]()
  found = optuna.create_study(storage=storage(workdir, url), study_name=sweep['name'],
                              direction=sweep['direction'], sampler=sampler, pruner=pruner,
                              load_if_exists=True)
  if 'identity' not in found.user_attrs:
    with filelock.FileLock(os.path.join(workdir, 'sweep', 'claim.lock')):
      if sweep['baseline'] and not found.get_trials(deepcopy=False):
        found.enqueue_trial(baseline_params(sweep, base), user_attrs={'baseline': True})
      if sweep['sampler'] == 'grid' and not found.get_trials(deepcopy=False):
        keys = list(sweep['space'])
        for combination in itertools.product(*(labels(sweep['space'][k]) for k in keys)):
          found.enqueue_trial(dict(zip(keys, combination)))
      found.set_user_attr('identity', identity)
  elif found.user_attrs['identity'] != identity:
    raise errors.UserError(
        f'{workdir}: its study {sweep["name"]!r} was made for {found.user_attrs["identity"]}, '
        f'not {identity}; sweep into another --workdir (or name that storage)')
  return found


def identity_of(config_arg, sweep, given):
  """What a study is: the config, the overrides (they change every trial) and the whole
  declaration but its budget (--trials may extend it): a sweep that chooses on another
  split or metric is another study, whose trials would not compare."""
  declaration = {k: v for k, v in sorted(sweep.items()) if k not in ('name', 'trials')}
  return ' '.join([config_arg, 'sweep', sweep['name'], *flag_lines(given), repr(declaration)])


def budget(sweep, trials):
  """How many trials in all: --trials, else the declaration's; a grid at most its size."""
  size = math.prod(len(v) for v in sweep['space'].values())
  return min(trials or sweep['trials'], size) if sweep['sampler'] == 'grid' else \
      (trials or sweep['trials'])


_claims = {}  # trial number -> the lock this process holds on it from claim to tell


def _take(workdir, number):
  """Whether this process now holds trial `number`'s claim, W/sweep/claims/NNN.lock: an
  flock, which the OS drops when its process ends however it ends (the trial's own workdir
  lock is let go when training ends, before the study is told)."""
  path = os.path.join(workdir, 'sweep', 'claims', f'{number:03d}.lock')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  lock = filelock.FileLock(path)
  try:
    lock.acquire(timeout=0)
  except filelock.Timeout:
    return False
  _claims[number] = lock
  return True


def trial_workdir(workdir, number):
  return os.path.join(workdir, 'trials', f'{number:03d}')


def claim(found, sweep, workdir, limit):
  """The next trial for this process, claimed: one a dead process left running (resumed from
  its checkpoint), else a new one while the budget allows; None when done. Under
  W/sweep/claim.lock, so two processes never take the same trial, and a trial without its
  workdir recorded can only be one whose process died while it was being made."""
  with filelock.FileLock(os.path.join(workdir, 'sweep', 'claim.lock')):
    made = 0
    for t in found.get_trials(deepcopy=False):
      if 'workdir' not in t.user_attrs:
        if t.state == optuna.trial.TrialState.RUNNING:
          found.tell(t.number, state=optuna.trial.TrialState.FAIL)
        continue
      made += 1
      if t.state == optuna.trial.TrialState.RUNNING and _take(workdir, t.number):
        console.say(f'Resuming trial {t.number} (its process stopped) in '
                    f'{t.user_attrs["workdir"]}...')
        return t.number, t.params
    if made >= limit:
      return None
    trial = found.ask(distributions(sweep))
    _take(workdir, trial.number)  # new: nobody else can hold it
    trial.set_user_attr('workdir', trial_workdir(workdir, trial.number))
    return trial.number, trial.params


def metric_at(workdir, key, step):
  """The logged value of `key` at `step` in a run's metrics.jsonl, or None."""
  for line in (files.read_text(files.join(workdir, 'metrics.jsonl')) or '').splitlines():
    row = json.loads(line)
    if row['step'] == step and key in row:
      return row[key]
  return None


def run_trial(found, sweep, workdir, number, params, base, given):
  """Trains trial `number` (resuming its checkpoint), reporting each evaluation to the pruner;
  tells the study how it ended."""
  from bengrapheme import restored
  frozen = found.get_trials(deepcopy=False)[number]
  trial_dir = trial_workdir(workdir, number)  # as this process sees W (a mount may differ)
  settings = values_of(sweep, params)
  config = trial_config(base, sweep, settings, workdir)
  trial = optuna.trial.Trial(found, frozen._trial_id)  # pylint: disable=protected-access
  # The earlier processes' seconds, as a number: `frozen` is the study's live copy, which
  # the seconds this process sets would update.
  earlier = frozen.user_attrs.get('seconds', 0.0)
  # What launch.train and launch.evaluate take to resume or score this trial as a run.
  files.write_atomic(os.path.join(trial_dir, 'overrides.flags'),
                     '\n'.join(flag_lines({**given, **settings})) + '\n')
  choose, key = sweep['choose'], f'{sweep["choose"]}/{sweep["metric"]}'

  def on_eval(step, name, scores):
    if name != choose:
      return
    flat = inference.flatten(scores)
    if sweep['metric'] not in flat:
      raise errors.ConfigError(
          f'sweep {sweep["name"]!r}: metric={sweep["metric"]!r} is not a score of evals.'
          f'{choose}; its scores: {", ".join(k for k, v in flat.items() if _is_number(v))}')
    trial.report(flat[sweep['metric']], step)
    _add_seconds(trial, earlier, began)  # kept so far, should the process be killed
    if trial.should_prune():
      raise optuna.TrialPruned(f'{key} {flat[sweep["metric"]]:.4f} at step {step}')

  console.say(f'Trial {number} in {trial_dir}: {settings}')
  began = time.perf_counter()
  try:
    state = train.train(config, trial_dir, on_eval=on_eval)
    step = int(jax.device_get(state['step']))
    if step < config.train.steps:
      raise Stopped(f'Preempted in trial {number} at step {step} (saved); rerun the same '
                    'command to resume the sweep.')
    value = metric_at(trial_dir, key, step)
    if value is None:  # stopped between its last checkpoint and that step's evaluation
      value = inference.flatten(restored.evaluate(
          config, trial_dir, [n for n in (config.eval.tune_split, choose) if n]))[key]
    _add_seconds(trial, earlier, began)
    found.tell(number, value)
    console.say(f'Trial {number}: {key} {value:.4f}')
  except Stopped:  # preempted: the next leg adds its time to this one's
    _add_seconds(trial, earlier, began)
    raise
  except optuna.TrialPruned as e:
    _add_seconds(trial, earlier, began)
    found.tell(number, state=optuna.trial.TrialState.PRUNED)
    console.say(f'Trial {number} pruned: {e}')
  except train.NonFinite as e:  # a setting that diverges is a result, not a crash
    trial.set_user_attr('error', str(e))
    _add_seconds(trial, earlier, began)
    found.tell(number, state=optuna.trial.TrialState.FAIL)
    console.say(f'Trial {number} failed: {e}')
  finally:
    _claims.pop(number).release()


def _add_seconds(trial, earlier, began):
  """The trial's own time (training and evaluation), summed over the processes that ran it:
  the `earlier` ones' and this one's since `began` (so setting it again replaces this
  process's share)."""
  trial.set_user_attr('seconds', earlier + time.perf_counter() - began)


def _is_number(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---------------------------------------------------------------- what it leaves


def table(found, sweep):
  """(header, rows) of every trial: number, state, the choosing metric, its steps, its
  seconds, each parameter's value."""
  params = list(sweep['space'])
  header = ['trial', 'state', f'{sweep["choose"]}/{sweep["metric"]}', 'step', 'seconds',
            *params, 'baseline', 'workdir']
  rows = []
  for t in found.get_trials(deepcopy=False):
    if 'workdir' not in t.user_attrs:
      continue
    value = t.value if t.value is not None else (
        t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None)
    step = t.last_step if t.last_step is not None else ''
    settings = {k: values_of(sweep, {k: v})[k.split(',')[0]] for k, v in t.params.items()}
    rows.append([t.number, t.state.name.lower(), '' if value is None else value, step,
                 round(t.user_attrs.get('seconds', 0.0), 1),
                 *[settings.get(p, '') for p in params],
                 'yes' if t.user_attrs.get('baseline') else '', t.user_attrs['workdir']])
  return header, rows


def chosen_trial(found):
  complete = [t for t in found.get_trials(deepcopy=False)
              if t.state == optuna.trial.TrialState.COMPLETE]
  return found.best_trial if complete else None


def plots(sweep, header, rows):
  """The choosing metric against each parameter, one chart each, a point a trial: a list's
  values at their place in it (ticks labelled with the values, so tuples and words plot
  too), a range on its own (log) axis."""
  metric, charts = header[2], []
  for i, key in enumerate(sweep['space'], start=5):
    values = sweep['space'][key]
    with matplotlib.rc_context(report.STYLE_RC):
      figure = Figure(figsize=(report.WIDTH / 96, report.HEIGHT / 96), dpi=96,
                      layout='constrained')
      ax = figure.add_subplot()
      for state in ('complete', 'pruned'):  # a pruned trial at its last evaluation
        shown = [row for row in rows if row[1] == state and row[2] != '']
        xs = [labels(values).index(labels([row[i]])[0]) if isinstance(values, list) else
              row[i] for row in shown]
        ax.scatter(xs, [row[2] for row in shown], s=30, label=state,
                   marker='o' if state == 'complete' else 'x')
      if isinstance(values, list):
        ax.set_xticks(range(len(values)), labels(values))
        ax.set_xlim(-0.5, len(values) - 0.5)
      elif values.get('log'):
        ax.set_xscale('log')
      ax.set_xlabel(key)
      ax.set_ylabel(metric)
      charts.append(report._svg(figure, ax, f'{metric} against {key}',  # pylint: disable=protected-access
                                legend=bool(rows)))
  return charts


def write_outputs(found, sweep, workdir, config_arg, given, identity, command):
  """W/sweep/trials.csv, report.html, chosen.flags and record.json, from the study as it is."""
  out = os.path.join(workdir, 'sweep')
  header, rows = table(found, sweep)
  text = io.StringIO()
  csv.writer(text, lineterminator='\n').writerows([header, *rows])
  files.write_atomic(os.path.join(out, 'trials.csv'), text.getvalue())
  best = chosen_trial(found)
  counts = {}
  for row in rows:
    counts[row[1]] = counts.get(row[1], 0) + 1
  summary = (f'{identity}: {len(rows)} trials ({", ".join(f"{n} {s}" for s, n in counts.items())}'
             f'); {sweep["direction"]} {header[2]}, chosen on {sweep["choose"]!r}. ')
  if best is not None:
    settings = values_of(sweep, best.params)
    summary += (f'Chosen: trial {best.number} ({best.value:.4f}): '
                + ', '.join(f'{k}={v!r}' for k, v in settings.items()) + '.')
    files.write_atomic(os.path.join(out, 'chosen.flags'), '\n'.join(
        [f'# {summary}', f'# python -m launch.train --config {config_arg} --flagfile '
         f'{os.path.join(out, "chosen.flags")} --data DATA --workdir DIR',
         *flag_lines({**given, **settings})]) + '\n')
  files.write_atomic(os.path.join(out, 'report.html'), report.page(
      f'Sweep {sweep["name"]}', report.note(summary),
      # The metric to 4 decimals; a setting as it was set (a learning rate of 0.00236).
      report.table(header, [[f'{v:.4f}' if i == 2 and _is_number(v) else str(v)
                             for i, v in enumerate(row)] for row in rows]),
      report.tag('h2', f'{header[2]} against each parameter'),
      report.row(*plots(sweep, header, rows))))
  record = dict(
      name=sweep['name'], identity=identity, command=command, commit=_commit(),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      machine=dict(host=socket.gethostname(), platform=platform.platform(),
                   cpus=os.cpu_count(), devices=str(jax.devices())),
      declaration={k: (repr(v) if k == 'space' else v) for k, v in sweep.items()},
      chosen=None if best is None else dict(trial=best.number, value=best.value,
                                            settings=repr(values_of(sweep, best.params))),
      trials=[dict(zip(header, row)) for row in rows])
  files.write_atomic(os.path.join(out, 'record.json'),
                     json.dumps(record, indent=1, default=repr) + '\n')


def _commit():
  result = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True,
                          text=True, check=False)
  return result.stdout.strip()


def report_test(found, sweep, base, workdir):
  """Scores the chosen trial on the run's own test split, once: W/sweep/test.json, kept;
  a second call shows it again without scoring."""
  from bengrapheme import restored
  path = os.path.join(workdir, 'sweep', 'test.json')
  if os.path.exists(path):
    console.show(f'The test split was scored once already: {path}\n{files.read_text(path)}')
    return
  if any(t.state == optuna.trial.TrialState.RUNNING for t in found.get_trials(deepcopy=False)):
    raise errors.UserError('--report_test: trials are still running; rerun it when the sweep '
                           'has finished (the test split is scored for the chosen trial only)')
  best = chosen_trial(found)
  if best is None:
    raise errors.UserError('--report_test: no trial has finished; nothing is chosen to score')
  tests = [n for n, e in base.evals.items() if e.get('split', n) == 'test' and not e.get('data')]
  if not tests:
    raise errors.UserError('--report_test: config.evals has no entry for the test split '
                           '(its labels may be unknown, as Kaggle\'s)')
  trial_dir = trial_workdir(workdir, best.number)
  config = trial_config(base, sweep, values_of(sweep, best.params), workdir)
  names = [n for n in (config.eval.tune_split, *tests) if n]
  metrics = restored.evaluate(config, trial_dir, names)
  files.write_atomic(path, json.dumps(dict(trial=best.number, workdir=trial_dir, **{
      n: metrics[n] for n in tests}), indent=1, default=repr) + '\n')
  console.show(f'Test split of the chosen trial {best.number}: {path}')


def run(base, sweep, workdir, config_arg, given=None, trials=0, url='', command=''):
  """Runs trials of `base` (the config `config_arg` with the command line's overrides
  `given` {path: value}) until the budget is spent, resuming any a dead process left, then
  writes the outputs; returns the study."""
  given = dict(sorted((given or {}).items()))
  if jax.process_count() > 1:  # each process would claim trials of its own
    raise errors.UserError(f'launch.sweep runs each trial in one process, not in a job of '
                           f'{jax.process_count()}: start one sweep process per machine or '
                           'GPU on the same study instead (docs/sweeps.md)')
  check(sweep, trial_config(base, sweep, {}, workdir))
  os.makedirs(os.path.join(workdir, 'sweep'), exist_ok=True)
  identity = identity_of(config_arg, sweep, given)
  found = study(sweep, workdir, url, identity, base)
  limit = budget(sweep, trials)
  while True:
    claimed = claim(found, sweep, workdir, limit)
    if claimed is None:
      break
    run_trial(found, sweep, workdir, *claimed, base, given)
    with filelock.FileLock(os.path.join(workdir, 'sweep', 'claim.lock')):
      write_outputs(found, sweep, workdir, config_arg, given, identity, command)
  with filelock.FileLock(os.path.join(workdir, 'sweep', 'claim.lock')):
    write_outputs(found, sweep, workdir, config_arg, given, identity, command)
  return found
