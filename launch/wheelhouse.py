"""The installed project: its console commands, and a wheelhouse for an offline install.

  python -m launch.wheelhouse --out dist/wheelhouse            # for this interpreter/platform
  python -m launch.wheelhouse --out dist/wheelhouse --python-version 3.11 \\
      --platform manylinux_2_28_x86_64                          # for another one (Kaggle's)

writes OUT with the project's wheel, a wheel of every runtime dependency (binary-only, for
the target Python and platform), and OUT/requirements.txt naming each one as name==version;
then prints its size and the install command, which needs no network:

  pip install --no-index --find-links OUT bengrapheme

A dependency published only as an sdist is built here into a wheel, which is kept only when
it is pure Python (or the target is this interpreter); any other dependency without a wheel
for the target stops the build with a message naming it. OUT is replaced whole, and only
when it is empty or a wheelhouse this command wrote.

The installed console commands are in launch/commands.py.
"""
import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

from bengrapheme import files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = 'bengrapheme'
LISTING = 'requirements.txt'
HEADER = '# Written by python -m launch.wheelhouse: every wheel in this folder, as name==version.'
# Kept when OUT is rebuilt (Kaggle's `kaggle datasets init -p OUT` writes it).
KEEP = ('dataset-metadata.json',)


class WheelhouseError(RuntimeError):
  """A wheelhouse that cannot be built, with the reason in words."""


def _pip(*args):
  """`python -m pip args` with this interpreter; (returncode, stdout + stderr)."""
  result = subprocess.run([sys.executable, '-m', 'pip', '--disable-pip-version-check', *args],
                          capture_output=True, text=True)
  return result.returncode, result.stdout + result.stderr


def _tail(text, lines=25):
  return '\n'.join(text.strip().splitlines()[-lines:])


def copy_sources(root, dest):
  """The files a wheel is built from, copied to `dest`: the top-level files and the
  top-level Python packages (folders with an __init__.py), without caches. Building from a
  copy leaves no build/ or *.egg-info in the checkout, and no stale build/lib file from an
  earlier build can slip into the wheel."""
  os.makedirs(dest, exist_ok=True)
  ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '*.egg-info')
  for entry in sorted(os.listdir(root)):
    src = os.path.join(root, entry)
    if entry.startswith('.') or entry.endswith('.egg-info'):
      continue
    if os.path.isfile(src):
      shutil.copy2(src, os.path.join(dest, entry))
    elif os.path.isfile(os.path.join(src, '__init__.py')):
      shutil.copytree(src, os.path.join(dest, entry), ignore=ignore)
  return dest


def build_project_wheel(root, out):
  """`pip wheel --no-deps` of the project at `root` into `out`; the wheel's path."""
  with tempfile.TemporaryDirectory(prefix='bengrapheme-src-') as src:
    copy_sources(root, src)
    code, log = _pip('wheel', '--no-deps', '--wheel-dir', out, src)
  wheels = [n for n in os.listdir(out) if n.startswith(f'{PROJECT}-') and n.endswith('.whl')]
  if code != 0 or len(wheels) != 1:
    raise WheelhouseError(f'pip wheel --no-deps {root} failed (exit {code}):\n{_tail(log)}')
  return os.path.join(out, wheels[0])


def wheel_requirements(wheel):
  """The Requires-Dist lines of a wheel's METADATA (markers included)."""
  with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
    metadata = email.parser.Parser().parsestr(z.read(name).decode('utf-8'))
  return metadata.get_all('Requires-Dist') or []


_LEGACY_MANYLINUX = {'manylinux1': (2, 5), 'manylinux2010': (2, 12), 'manylinux2014': (2, 17)}


def expand_platforms(platforms):
  """Each platform tag plus the older manylinux tags a machine with that glibc also runs:
  manylinux_2_28_x86_64 -> manylinux_2_28_x86_64, manylinux_2_27_x86_64, ...,
  manylinux2014_x86_64, ..., manylinux1_x86_64. (pip's --platform takes a manylinux_2_Y tag
  literally, so without this a glibc 2.35 target would match no manylinux_2_28 wheel.)"""
  out = []
  for platform in platforms:
    match = re.fullmatch(r'manylinux_(\d+)_(\d+)_(\w+)', platform)
    legacy = re.fullmatch(r'(manylinux\d+)_(\w+)', platform)
    if match:
      major, minor, arch = int(match[1]), int(match[2]), match[3]
    elif legacy and legacy[1] in _LEGACY_MANYLINUX:
      (major, minor), arch = _LEGACY_MANYLINUX[legacy[1]], legacy[2]
    else:
      out.append(platform)
      continue
    out += [f'manylinux_{major}_{m}_{arch}' for m in range(minor, 4, -1)]
    out += [f'{name}_{arch}' for name, version in _LEGACY_MANYLINUX.items()
            if version <= (major, minor)][::-1]
  return list(dict.fromkeys(out))


def target_args(python_version, platforms):
  """pip's options that select wheels for the target interpreter and platforms."""
  args = ['--only-binary=:all:', '--python-version', python_version]
  for platform in expand_platforms(platforms):
    args += ['--platform', platform]
  return args


def is_host_target(python_version, platforms):
  """Whether wheels built by this interpreter fit the target."""
  return not platforms and python_version == '%d.%d' % sys.version_info[:2]


_NO_MATCH = re.compile(r'No matching distribution found for (\S+)')


def _build_sdist_wheel(requirement, out, host_target, why):
  """Builds `requirement` (no wheel for the target) from its sdist into `out`, if the wheel
  is pure Python or the target is this interpreter; else raises, naming it."""
  with tempfile.TemporaryDirectory(prefix='bengrapheme-sdist-') as built:
    project = re.match(r'[A-Za-z0-9._-]+', requirement).group(0)
    code, log = _pip('wheel', '--no-deps', '--no-binary', project, '--wheel-dir', built,
                     requirement)
    names = os.listdir(built) if code == 0 else []
    if len(names) != 1:
      no_sdist = 'No matching distribution found' in log
      raise WheelhouseError(
          f'{requirement} has no wheel for the target ({why})'
          + (' and no sdist to build one from. Pick a --python-version / --platform it '
             'publishes wheels for (see its files on PyPI).' if no_sdist else
             f', and building one from its sdist failed (exit {code}):\n{_tail(log)}'))
    name = names[0]
    if not (name.endswith('-none-any.whl') or host_target):
      raise WheelhouseError(
          f'{requirement} has no wheel for the target ({why}); its sdist builds into '
          f'{name} here, which is specific to this machine. Build the wheelhouse on a '
          'machine like the target, or pick a --python-version / --platform that '
          f'{requirement} publishes wheels for.')
    shutil.move(os.path.join(built, name), os.path.join(out, name))
  return name


def download_dependencies(project_wheel, out, python_version, platforms, extras=()):
  """Wheels of everything `project_wheel` (and `extras`) need, for the target, into `out`."""
  host_target = is_host_target(python_version, platforms)
  why = (f'Python {python_version}, platform '
         f'{", ".join(platforms) or sysconfig.get_platform() + " (this machine)"}')
  built = []
  while True:
    code, log = _pip('download', '--dest', out, '--find-links', out,
                     *target_args(python_version, platforms), project_wheel, *extras)
    if code == 0:
      return built
    missing = _NO_MATCH.findall(log)
    if not missing:
      raise WheelhouseError(f'pip download of the dependencies failed (exit {code}):\n'
                            f'{_tail(log)}')
    requirement = missing[-1]
    if requirement in built:
      raise WheelhouseError(f'{requirement}: no wheel for the target ({why}), even after '
                            f'building one from its sdist:\n{_tail(log)}')
    print(f'{requirement}: no wheel for {why}; trying to build one from its sdist', flush=True)
    # pip's line on the versions it skipped for their Requires-Python, when it wrote one.
    skipped = [line for line in log.splitlines() if 'require a different python' in line]
    _build_sdist_wheel(requirement, out, host_target, why + ''.join(
        f'; pip: {line.removeprefix("ERROR: ")}' for line in skipped[-1:]))
    built.append(requirement)


def wheel_name_version(filename):
  """('name', 'version') of a wheel file, the name normalised as in PEP 503."""
  parts = filename[:-len('.whl')].split('-')
  return re.sub(r'[-_.]+', '-', parts[0]).lower(), parts[1]


def write_listing(out):
  """OUT/requirements.txt: name==version of every wheel in OUT; the (name, version) list."""
  pins = sorted(wheel_name_version(n) for n in os.listdir(out) if n.endswith('.whl'))
  names = [name for name, _ in pins]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise WheelhouseError(f'{out} holds two versions of {", ".join(twice)}')
  with open(os.path.join(out, LISTING), 'w') as f:
    f.write(HEADER + '\n' + ''.join(f'{n}=={v}\n' for n, v in pins))
  return pins


def check_offline_install(out, python_version, platforms):
  """Resolves the offline install from OUT alone, as the notebook will (nothing installed)."""
  with tempfile.TemporaryDirectory(prefix='bengrapheme-dry-') as target:
    code, log = _pip('install', '--dry-run', '--ignore-installed', '--no-index',
                     '--find-links', out, '--target', target,
                     *target_args(python_version, platforms), PROJECT)
  if code != 0:
    raise WheelhouseError(f'pip install --no-index --find-links {out} {PROJECT} does not '
                          f'resolve from the wheelhouse alone:\n{_tail(log)}')


def _is_wheelhouse(path):
  """Whether `path` may be replaced: missing, empty, or a wheelhouse this module wrote."""
  if not os.path.exists(path):
    return True
  if not os.path.isdir(path):
    return False
  if not os.listdir(path):
    return True
  try:
    with open(os.path.join(path, LISTING)) as f:
      return f.readline().rstrip('\n') == HEADER
  except OSError:
    return False


def _size(path):
  return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def build(out, python_version=None, platforms=(), extras=(), root=ROOT):
  """Writes the wheelhouse OUT (see the module docstring); returns (pins, bytes)."""
  python_version = python_version or '%d.%d' % sys.version_info[:2]
  if not re.fullmatch(r'3\.\d+', python_version):
    raise WheelhouseError(f'--python-version {python_version}: expected MAJOR.MINOR, e.g. 3.11')
  out = os.path.abspath(out)
  if not _is_wheelhouse(out):
    raise WheelhouseError(f'{out} exists and is not a wheelhouse this command wrote (no '
                          f'{LISTING} starting {HEADER!r}); pass an empty or new folder')
  # Not durable (no fsync of every wheel): a rerun rebuilds it.
  with files.atomic_dir(out, durable=False) as tmp:
    wheel = build_project_wheel(root, tmp)
    download_dependencies(wheel, tmp, python_version, platforms, extras)
    pins = write_listing(tmp)
    check_offline_install(tmp, python_version, platforms)
    for name in KEEP:
      if os.path.isfile(os.path.join(out, name)):
        shutil.copy2(os.path.join(out, name), os.path.join(tmp, name))
    # The old wheelhouse goes only now, with the new one whole beside it.
    shutil.rmtree(out, ignore_errors=True)
  return pins, _size(out)


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog='python -m launch.wheelhouse',
      description='Wheels of the project and all its runtime dependencies, for an install '
                  'with no network (a Kaggle notebook).')
  parser.add_argument('--out', required=True, help='the wheelhouse folder (replaced)')
  parser.add_argument('--python-version', default=None,
                      help="the target's Python, MAJOR.MINOR (default: this interpreter's, "
                           '%d.%d)' % sys.version_info[:2])
  parser.add_argument('--platform', action='append', default=[],
                      help="the target's platform tag, e.g. manylinux_2_28_x86_64 (pip also "
                           'takes the older manylinux ones); repeatable; default: this '
                           "machine's")
  parser.add_argument('--extra', action='append', default=[],
                      help="more requirements to include, e.g. 'jax[cuda12]==0.10.2' for a "
                           'GPU notebook; repeatable')
  args = parser.parse_args(argv)
  try:
    pins, size = build(args.out, args.python_version, args.platform, args.extra)
  except WheelhouseError as e:
    raise SystemExit(f'wheelhouse: {e}') from None
  out = os.path.abspath(args.out)
  print(f'{out}: {len(pins)} wheels, {size / 2**20:.1f} MiB (listed in {LISTING})')
  print('Install with no network:')
  print(f'  pip install --no-index --find-links {out} {PROJECT}')
  print('In a Kaggle notebook, with this folder uploaded as the dataset DATASET:')
  print(f'  !pip install --no-index --find-links /kaggle/input/DATASET {PROJECT}')


if __name__ == '__main__':
  main()
