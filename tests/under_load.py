"""Runs one test several times in a row beside a CPU load, and keeps a record of every run.

  python tests/under_load.py                       # the two-process index test, 10 runs
  python tests/under_load.py --runs 3 --node tests/retrieval/test_index_search.py::test_...

A test that passes alone can fail when the machine is loaded (a full local run of the suite,
other jobs): timeouts that are too short, processes that start at once. This starts
`--load` processes that spin on the CPU (default: twice the cores), then runs pytest once on
the node with it repeated `--runs` times (its module's fixtures are built once, the test
body runs every time), and writes what happened to --out: the command, commit, date,
machine, the load average before and after, each run's outcome and duration, and the tail
of the output of any run that failed. Exits 0 only when every run passed.

Also a pytest plugin (-p under_load, which this script passes): UNDER_LOAD_RUNS=N repeats
the selected tests N times.
"""
import argparse
import datetime
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODE = ('tests/retrieval/test_index_search.py::'
        'test_two_processes_build_the_index_one_process_builds')
OUT = os.path.join(ROOT, 'experiments', 'logs', 'two-process-index-under-load.json')


# ---------------------------------------------------------------- the pytest plugin


@pytest.fixture
def under_load_run(request):
  return request.param


def pytest_runtest_logreport(report):
  """Each run's outcome, appended to UNDER_LOAD_LOG as it ends, so that runs cut short by
  the timeout still leave their record."""
  log = os.environ.get('UNDER_LOAD_LOG')
  if log and (report.when == 'call' or report.outcome != 'passed'):
    with open(log, 'a') as f:
      f.write(json.dumps(dict(
          name=report.nodeid.split('::')[-1], phase=report.when, outcome=report.outcome,
          seconds=round(report.duration, 1),
          message=None if report.passed else str(report.longrepr)[-6000:])) + '\n')


def pytest_generate_tests(metafunc):
  runs = int(os.environ.get('UNDER_LOAD_RUNS', '1'))
  if runs > 1:
    metafunc.fixturenames.append('under_load_run')
    metafunc.parametrize('under_load_run', range(1, runs + 1), indirect=True,
                         ids=lambda i: f'run{i}of{runs}')


# ---------------------------------------------------------------- the runner


def spin(stop_at):
  while time.monotonic() < stop_at:
    pass


def git(*args):
  return subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--node', default=NODE, help='the pytest node id to repeat')
  parser.add_argument('--runs', type=int, default=10)
  parser.add_argument('--load', type=int, default=2 * os.cpu_count(),
                      help='processes spinning on the CPU beside the runs')
  parser.add_argument('--out', default=OUT, help='where to write the record (JSON)')
  parser.add_argument('--timeout', type=float, default=4 * 3600,
                      help='seconds before the load stops and the runs are abandoned')
  args = parser.parse_args()
  if args.runs < 1 or args.load < 0:
    parser.error(f'--runs {args.runs} --load {args.load}: expected --runs >= 1 and --load >= 0')

  dirty = bool(git('status', '--porcelain'))
  load_before = os.getloadavg()
  started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
  spinners = [multiprocessing.Process(target=spin, args=(time.monotonic() + args.timeout,),
                                      daemon=True) for _ in range(args.load)]
  for p in spinners:
    p.start()
  with tempfile.TemporaryDirectory(prefix='under-load-') as tmp:
    log = os.path.join(tmp, 'runs.jsonl')
    command = [sys.executable, '-m', 'pytest', '-p', 'under_load', '-m', 'slow or not slow',
               '-q', '-rA', f'--basetemp={os.path.join(tmp, "pytest")}', args.node]
    # PYTHONFAULTHANDLER: a process killed by a signal (SIGABRT, SIGSEGV) prints the Python
    # stack of each of its threads, which the failing run's output then holds.
    env = dict(os.environ, UNDER_LOAD_RUNS=str(args.runs), UNDER_LOAD_LOG=log,
               PYTHONFAULTHANDLER='1',
               PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get('PYTHONPATH')])))
    start = time.monotonic()
    # A session of its own, so that a timeout ends the test's processes too (launch.local and
    # the jobs it started), not pytest alone.
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
      output, code = proc.communicate(timeout=args.timeout)[0], proc.returncode
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      output, code = proc.communicate()[0] + f'\ntimed out after {args.timeout} s', None
    seconds = time.monotonic() - start
    load_during = os.getloadavg()
    for p in spinners:
      p.terminate()
    runs = []
    if os.path.exists(log):
      with open(log) as f:
        runs = [json.loads(line) for line in f]
  passed = sum(r['outcome'] == 'passed' for r in runs)
  record = dict(
      what=f'{args.node}, {args.runs} runs in a row beside {args.load} processes spinning on '
           f'the {os.cpu_count()} cores',
      command=' '.join(['python', 'tests/under_load.py'] + sys.argv[1:]),
      pytest_command=' '.join(command[1:]), commit=git('rev-parse', 'HEAD') + '-dirty' * dirty,
      date=started, machine=dict(cpu_count=os.cpu_count(), platform=platform.platform(),
                                 python=platform.python_version()),
      load_average_before=load_before, load_average_at_end=load_during,
      seconds=round(seconds, 1), pytest_exit_code=code, passed=passed, of=args.runs,
      finished=len([r for r in runs if r['phase'] == 'call']),
      runs=runs, output_tail=output[-4000:])
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(record, f, indent=1)
    f.write('\n')
  print(f'{passed}/{args.runs} passed ({seconds:.0f} s, load average {load_before[0]:.1f} '
        f'before, {load_during[0]:.1f} at the end); record: {args.out}')
  return 0 if passed == args.runs and code == 0 else 1


if __name__ == '__main__':
  sys.exit(main())
