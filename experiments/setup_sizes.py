"""What the two setups install, on this machine: a fresh venv of requirements.txt alone (what
`make demo` makes), this checkout's venv with the tests' extras, its largest parts, the npm
fonts and Debian's Chromium; kept as a record that docs/benchmarks.md cites.

  python -m experiments.setup_sizes --record setup-sizes

The fresh venv is built in a temporary folder with pip (its cache makes a rerun quick) and
removed after. Sizes are `du -sb` (MB = 10^6 bytes); Debian's, dpkg's Installed-Size.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

from bench import common
from experiments import records


def megabytes(path):
  out = subprocess.run(['du', '-sb', path], check=True, capture_output=True, text=True).stdout
  return round(int(out.split()[0]) / 1e6, 1)


def debian_megabytes(package):
  out = subprocess.run(['dpkg-query', '-W', '-f=${Installed-Size}', package], check=True,
                       capture_output=True, text=True).stdout
  return round(int(out) * 1024 / 1e6, 1)  # dpkg counts KiB


def fresh_venv_megabytes():
  with tempfile.TemporaryDirectory() as tmp:
    venv = os.path.join(tmp, 'venv')
    subprocess.run([sys.executable, '-m', 'venv', venv], check=True)
    pip = [os.path.join(venv, 'bin', 'python'), '-m', 'pip', 'install', '-q']
    subprocess.run([*pip, '--upgrade', 'pip'], check=True)
    subprocess.run([*pip, '-r', os.path.join(common.ROOT, 'requirements.txt')], check=True)
    return megabytes(venv)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--record', default='', help='keep the sizes as experiments/records/NAME.json')
  args = parser.parse_args()
  commit = records.commit_of() if args.record else ''
  venv = os.path.join(common.ROOT, '.venv')
  site = glob.glob(os.path.join(venv, 'lib', 'python*', 'site-packages'))[0]
  sizes = dict(demo_venv_mb=fresh_venv_megabytes(), test_venv_mb=megabytes(venv),
               **{f'{name}_mb': megabytes(os.path.join(site, name))
                  for name in ('torch', 'nvidia', 'triton')},
               npm_fonts_mb=megabytes(os.path.join(common.ROOT, 'fonts', 'node_modules')),
               **{f'debian_{p.replace("-", "_")}_mb': debian_megabytes(p)
                  for p in ('chromium', 'chromium-common')})
  for name, value in sizes.items():
    print(f'{name}: {value:,} MB')
  if args.record:
    command = 'python -m experiments.setup_sizes --record ' + args.record
    print(records.add(args.record, None, [command], commit,
                      'du -sb of each; the demo venv built fresh from requirements.txt',
                      scores=sizes))


if __name__ == '__main__':
  main()
