"""launch.sweep (bengrapheme/sweep.py): a sweep declared in the config runs its trials as
ordinary runs, resumes after a kill, shares its study between processes, prunes, and never
chooses on the run's own test split."""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from absl import flags
from ml_collections import config_flags

from conftest import ROOT, run_module

# A config file of the tests' own: configs/grapheme.py:test with sweeps the tests need.
SWEEPS = '''
from configs.grapheme import get_config


def get_sweeps(arg):
  common = dict(choose='val', every=4, sampler='grid', pruner='', startup_trials=1)
  return {{'four': dict(common, space={{'train.lr': [1e-3, 2e-3, 4e-3, 8e-3]}}, trials=4),
          'two': dict(common, space={{'train.lr': [1e-3, 1e-2]}}, trials=2),
          'long': dict(common, space={{'train.lr': [1e-3]}}, trials=1, every=200),
          'pruned': dict(common, space={{'train.lr': [1e-3, 1e-2]}}, trials=1, pruner='median',
                         sampler='tpe'),
          'on_test': dict(common, space={{'train.lr': [1e-3]}}, trials=1, choose='test'),
          'on_family': dict(common, space={{'train.lr': [1e-3]}}, trials=1,
                            choose='family',
                            evals=dict(family=dict(type='grapheme', split='test',
                                                   data={data!r})))}}
'''


@pytest.fixture
def sweeps_config(tmp_path, grapheme_data):
  path = tmp_path / 'sweeps.py'
  path.write_text(SWEEPS.format(data=grapheme_data))
  return f'{path}:test'


def sweep_args(config, name, data, workdir, *more):
  return ['--config', config, '--sweep', name, '--data', data, '--workdir', workdir, *more]


def trials_table(workdir):
  with open(os.path.join(workdir, 'sweep', 'trials.csv')) as f:
    return list(csv.DictReader(f))


def logged_steps(trial_dir, key='val/score'):
  with open(os.path.join(trial_dir, 'metrics.jsonl')) as f:
    return [row['step'] for row in map(json.loads, f) if key in row]


def test_a_sweep_choosing_on_test_is_refused_before_any_work(sweeps_config, grapheme_data,
                                                             tmp_path):
  workdir = tmp_path / 'sweep'
  result = run_module('launch.sweep', *sweep_args(sweeps_config, 'on_test', grapheme_data,
                                                  workdir), check=False, timeout=300)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "choose='test' scores the run's own test split" in lines[0]
  assert not workdir.exists()


def test_a_test_split_of_another_folder_may_choose(sweeps_config):
  from bengrapheme import sweep
  from configs import grapheme
  declared = sweep.declared(sweeps_config, 'on_family')
  config = grapheme.get_config('test')
  sweep.check(declared, sweep.trial_config(config, declared, {}, '/tmp/unused'))


def test_the_declared_sweeps_check_against_their_configs():
  from bengrapheme import sweep
  from configs import fragments, grapheme
  for module, arg, name in ((grapheme, 'test', 'smoke'), (fragments, 'test', 'smoke')):
    declared = sweep.declared(f'configs/{module.__name__.split(".")[-1]}.py:{arg}', name)
    sweep.check(declared, sweep.trial_config(module.get_config(arg), declared, {}, '/tmp/w'))
  # The demos' family folders are data their docstrings write; everything else checks.
  for module, name in ((grapheme, 'lr_tau'), (fragments, 'recipe')):
    declared = sweep.declared(f'configs/{module.__name__.split(".")[-1]}.py:demo', name)
    declared['evals']['valfam']['data'] = '/no/such/folder'
    with pytest.raises(sweep.errors.ConfigError, match='evals.valfam.data=.*no such folder'):
      sweep.check(declared, sweep.trial_config(module.get_config('demo'), declared, {},
                                               '/tmp/w'))


def test_chosen_flags_set_what_the_trial_trained(tmp_path):
  from bengrapheme import sweep
  from configs import fragments
  declared = sweep.declared('configs/fragments.py:demo', 'recipe')
  params = {'train.lr': 0.0051, 'train.writers_per_batch': 32, 'train.warmup_steps': 150,
            'input.scales,input.eval_scales': repr((0.85, 1.0, 1.2))}
  settings = sweep.values_of(declared, params)
  trained = sweep.trial_config(fragments.get_config('demo'), declared, settings, str(tmp_path))
  path = tmp_path / 'chosen.flags'
  path.write_text('# a comment line, as chosen.flags starts with\n' +
                  '\n'.join(sweep.flag_lines({'train.labels': 'surrogate', **settings})))
  argv = ['launch.train', '--config', os.path.join(ROOT, 'configs/fragments.py:demo'),
          '--flagfile', str(path)]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  values(argv)
  for key in ('train.lr', 'train.writers_per_batch', 'train.warmup_steps', 'input.scales',
              'input.eval_scales'):
    assert sweep.errors.field(values.config, key) == sweep.errors.field(trained, key), key
  assert values.config.input.scales == (0.85, 1.0, 1.2)
  assert values.config.train.labels == 'surrogate'


@pytest.mark.slow
def test_a_pruned_trial_stops_at_its_first_evaluation_below_the_bar(sweeps_config,
                                                                  grapheme_data, tmp_path):
  import optuna
  from bengrapheme import sweep
  workdir = str(tmp_path / 'sweep')
  # An earlier trial scored 1.0 (every image right) at each evaluation: the median pruner's
  # bar, which no trial of a few steps reaches.
  os.makedirs(os.path.join(workdir, 'sweep'))
  study = optuna.create_study(storage=sweep.storage(workdir, ''), study_name='pruned',
                              direction='maximize')
  lr = optuna.distributions.CategoricalDistribution([1e-3, 1e-2])
  study.add_trial(optuna.trial.create_trial(
      params={'train.lr': 1e-3}, distributions={'train.lr': lr}, value=1.0,
      intermediate_values={4: 1.0, 8: 1.0}))
  run_module('launch.sweep', *sweep_args(sweeps_config, 'pruned', grapheme_data, workdir),
             timeout=600)
  [row] = trials_table(workdir)
  assert (row['state'], row['step']) == ('pruned', '4')
  assert logged_steps(row['workdir']) == [4]  # evaluated once, then stopped
  assert sorted(os.listdir(os.path.join(row['workdir'], 'checkpoints'))) == ['2', '4']


@pytest.mark.slow
@pytest.mark.parametrize('config, data', [('configs/grapheme.py:test', 'grapheme_data'),
                                          ('configs/fragments.py:test', 'fragment_data')])
def test_the_smoke_sweep_runs_and_scores_test_once(config, data, tmp_path, request,
                                                   monkeypatch):
  data = request.getfixturevalue(data)
  workdir = str(tmp_path / 'sweep')
  run_module('launch.sweep', *sweep_args(config, 'smoke', data, workdir), timeout=900)
  rows = trials_table(workdir)
  # The second may fall below the first at its first evaluation (median pruner, 1 startup).
  assert rows[0]['state'] == 'complete' and rows[1]['state'] in ('complete', 'pruned')
  for row in rows:
    assert os.path.exists(os.path.join(row['workdir'], 'config.json'))
    assert not any(k.startswith('test/') for line in open(os.path.join(row['workdir'],
                                                                         'metrics.jsonl'))
                   for k in json.loads(line))  # no trial scores test
  out = os.path.join(workdir, 'sweep')
  assert {'trials.csv', 'report.html', 'chosen.flags', 'record.json'} <= set(os.listdir(out))
  assert open(os.path.join(out, 'report.html')).read().count('<svg') == 1  # one parameter
  first = run_module('launch.sweep', *sweep_args(config, 'smoke', data, workdir,
                                                 '--report_test'), timeout=900)
  assert 'Test split of the chosen trial' in first.stdout + first.stderr
  scored = open(os.path.join(out, 'test.json')).read()
  again = run_module('launch.sweep', *sweep_args(config, 'smoke', data, workdir,
                                                 '--report_test'), timeout=900)
  assert 'scored once already' in again.stdout + again.stderr
  assert open(os.path.join(out, 'test.json')).read() == scored
  assert 'Trial ' not in again.stdout + again.stderr  # nothing trained again
  # The chosen settings train again through launch.train.
  chosen = json.load(open(os.path.join(out, 'record.json')))['chosen']
  lr = eval(chosen['settings'])['train.lr']  # pylint: disable=eval-used
  trained = str(tmp_path / 'again')
  run_module('launch.train', f'--config={config}', '--flagfile', os.path.join(out,
             'chosen.flags'), '--data', data, '--workdir', trained, '--config.train.steps=2')
  assert json.load(open(os.path.join(trained, 'config.json')))['train']['lr'] == lr
  # Kept as a record, its table is every trial with the choice marked.
  from experiments import records
  monkeypatch.setattr(records, 'RECORDS', str(tmp_path / 'records'))
  monkeypatch.setitem(records.SWEEP_TABLES, 'smoke-sweep', 'sweep-smoke')
  records.add_sweep('sweep-smoke', workdir, '')
  table = records.table('smoke-sweep')
  assert table.count('\n| ') == 2 and f'| {chosen["value"]:.4f} | complete |' in table, table
  assert '| chosen |' in table and 'chose nothing): test/score' in table, table
  assert '--report_test' not in table  # the record names the sweep's command


def wait_for(path, process, log):
  """Returns once `path` exists, failing with the end of `log` if the sweep `process` ends
  first."""
  while not os.path.isdir(path):
    assert process.poll() is None, open(log.name).read()[-3000:]
    time.sleep(0.05)


def start_sweep(args, log):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  return subprocess.Popen([sys.executable, '-m', 'launch.sweep', *map(str, args)], cwd=ROOT,
                          env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_sweep_killed_in_its_second_trial_resumes_each_trial_once(sweeps_config,
                                                                    grapheme_data, tmp_path):
  workdir = str(tmp_path / 'sweep')
  args = sweep_args(sweeps_config, 'two', grapheme_data, workdir, '--config.train.steps=40')
  second = os.path.join(workdir, 'trials', '001', 'checkpoints', '6')
  with open(tmp_path / 'first.log', 'w') as log:
    process = start_sweep(args, log)
    wait_for(second, process, log)  # a finished checkpoint of the second trial
    process.send_signal(signal.SIGKILL)
    process.wait()
  first_trial = os.path.join(workdir, 'trials', '000', 'metrics.jsonl')
  kept = os.stat(first_trial).st_mtime_ns
  rerun = run_module('launch.sweep', *args, timeout=900)
  output = rerun.stdout + rerun.stderr
  assert 'Resuming trial 1' in output and 'Trial 0 ' not in output
  assert 'Resumed from' in output  # from its checkpoint, not from step 0
  assert os.stat(first_trial).st_mtime_ns == kept  # the finished trial untouched
  rows = trials_table(workdir)
  assert [(r['trial'], r['state'], r['step']) for r in rows] == [('0', 'complete', '40'),
                                                                  ('1', 'complete', '40')]
  for row in rows:  # each evaluation logged once
    assert logged_steps(row['workdir']) == list(range(4, 41, 4))


@pytest.mark.slow
def test_a_test_report_asked_while_another_process_sweeps_is_given_after_it_as_said(
    sweeps_config, grapheme_data, tmp_path):
  workdir = str(tmp_path / 'sweep')
  args = sweep_args(sweeps_config, 'long', grapheme_data, workdir, '--config.train.steps=200')
  training = os.path.join(workdir, 'trials', '000', 'checkpoints')
  with open(tmp_path / 'sweep.log', 'w') as log:
    process = start_sweep(args, log)
    try:
      wait_for(training, process, log)  # the trial is training
      early = run_module('launch.sweep', *args, '--report_test', check=False)
      assert early.returncode == 1 and ('trials are still running; rerun it when the sweep '
                                        'has finished') in early.stderr, early.stderr[-2000:]
      assert process.wait(timeout=900) == 0
    finally:
      if process.poll() is None:
        process.kill()
  scored = run_module('launch.sweep', *args, '--report_test', timeout=900)  # as said
  assert 'Test split of the chosen trial' in scored.stdout + scored.stderr
  assert 'Trial ' not in scored.stdout + scored.stderr  # nothing trained again


@pytest.mark.slow
def test_a_preempted_sweep_resumes_when_the_same_command_is_rerun(sweeps_config,
                                                                  grapheme_data, tmp_path):
  workdir = str(tmp_path / 'sweep')
  args = sweep_args(sweeps_config, 'two', grapheme_data, workdir, '--config.train.steps=40')
  first = os.path.join(workdir, 'trials', '000', 'checkpoints', '6')
  with open(tmp_path / 'first.log', 'w') as log:
    started = time.perf_counter()
    process = start_sweep(args, log)
    wait_for(os.path.dirname(os.path.dirname(first)), process, log)
    began = time.perf_counter()
    wait_for(first, process, log)
    trained = time.perf_counter() - began  # less than the trial's own time so far
    process.send_signal(signal.SIGTERM)  # what a scheduler sends before it preempts
    assert process.wait(timeout=300) != 0
    ran = time.perf_counter() - started  # more than it
  said = open(tmp_path / 'first.log').read()
  assert re.search(r'Preempted in trial 0 at step \d+ \(saved\); rerun the same command to '
                   r'resume the sweep\.', said), said[-3000:]
  # The first leg's time is kept, so the table sums the legs.
  import optuna
  from bengrapheme import sweep
  kept = optuna.load_study(study_name='two', storage=sweep.storage(workdir, '')).trials[0]
  assert trained <= kept.user_attrs.get('seconds', 0) <= ran, (kept.user_attrs, trained, ran)
  began = time.perf_counter()
  rerun = run_module('launch.sweep', *args, timeout=900)  # as said
  rerun_ran = time.perf_counter() - began
  assert 'Resumed from' in rerun.stdout + rerun.stderr
  rows = trials_table(workdir)
  assert [r['state'] for r in rows] == ['complete', 'complete']
  # Each evaluation sets this process's share again, never adding it twice.
  assert kept.user_attrs['seconds'] < float(rows[0]['seconds']) <= ran + rerun_ran


def test_a_workdir_of_another_sweep_is_refused_and_another_workdir_sweeps(sweeps_config,
                                                                         tmp_path):
  from bengrapheme import errors, sweep
  two = sweep.declared(sweeps_config, 'two')
  sweep.study(two, str(tmp_path / 'a'), '', 'sweep two')
  with pytest.raises(errors.UserError, match='sweep into another --workdir') as refused:
    sweep.study(two, str(tmp_path / 'a'), '', 'sweep two, other flags')
  assert str(tmp_path / 'a') in str(refused.value)
  sweep.study(two, str(tmp_path / 'b'), '', 'sweep two, other flags')  # as said
  # Choosing on another split, metric or direction is another study; a larger budget is not.
  same = sweep.identity_of(sweeps_config, two, {})
  assert sweep.identity_of(sweeps_config, dict(two, trials=9), {}) == same
  for changed in (dict(choose='family'), dict(metric='tuned/score'), dict(every=8),
                  dict(direction='minimize'), dict(pruner='median')):
    assert sweep.identity_of(sweeps_config, dict(two, **changed), {}) != same, changed


@pytest.mark.slow
def test_two_processes_on_one_study_finish_distinct_trials(sweeps_config, grapheme_data,
                                                          tmp_path):
  workdir = str(tmp_path / 'sweep')
  args = sweep_args(sweeps_config, 'four', grapheme_data, workdir)
  logs = [open(tmp_path / f'{i}.log', 'w+') for i in range(2)]
  processes = [start_sweep(args, log) for log in logs]
  for process in processes:
    assert process.wait(timeout=900) == 0
  outputs = []
  for log in logs:
    log.seek(0)
    outputs.append(log.read())
  rows = trials_table(workdir)
  assert [r['state'] for r in rows] == ['complete'] * 4
  assert sorted(float(r['train.lr']) for r in rows) == [1e-3, 2e-3, 4e-3, 8e-3]
  started = [line.split(' in ')[0].split('] ')[-1] for out in outputs
             for line in out.splitlines() if '] Trial ' in line and ' in ' in line]
  assert sorted(started) == [f'Trial {n}' for n in range(4)]  # each trial trained once
  assert all('Trial ' in out for out in outputs)  # both processes worked


def test_the_baseline_trial_is_the_configs_own_settings(sweeps_config, tmp_path):
  """baseline=True: trial 0 trains today's settings, so the table shows whether any other
  beats them; a config whose own value lies outside the space is refused before any work."""
  import configs.grapheme
  from bengrapheme import errors, sweep
  base = configs.grapheme.get_config('test')
  declared = dict(sweep.declared(sweeps_config, 'pruned'), baseline=True,
                  space={'train.lr': dict(low=1e-4, high=1.0, log=True),
                         'train.warmup_steps': [0, 1, 2, base.train.warmup_steps + 5]})
  base.train.warmup_steps += 5
  sweep.check(declared, base)
  found = sweep.study(declared, str(tmp_path / 'a'), '', 'baseline', base)
  first = found.ask(sweep.distributions(declared))  # what a claim draws first
  assert first.number == 0 and first.params == {'train.lr': base.train.lr,
                                                'train.warmup_steps': base.train.warmup_steps}
  assert first.user_attrs == {'baseline': True}
  base.train.warmup_steps = 3
  with pytest.raises(errors.ConfigError, match=r"config\.train\.warmup_steps=3 lies outside"):
    sweep.check(declared, base)
