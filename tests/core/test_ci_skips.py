"""Under CI=true a test that does not run to its end fails (tests/conftest.py): CI cannot pass
by skipping the browser or root tests when their prerequisite is missing, by skipping a whole
module at collection, or by an xfail; elsewhere each stays what it is."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

SKIP = 'import pytest\n\ndef test_page():\n  pytest.skip("chromium is not installed")\n'
# A module-level importorskip skips the whole module while pytest collects it.
COLLECTION_SKIP = ('import pytest\n\npytest.importorskip("no_such_module_here")\n\n'
                   'def test_page():\n  pass\n')
XFAIL = ('import pytest\n\n@pytest.mark.xfail(reason="known to fail")\n'
         'def test_page():\n  assert False\n')


def scratch_pytest(tmp_path, source, ci, allowed=None):
  """pytest's summary of one test file `source` beside a copy of tests/conftest.py, its
  ALLOWED_SKIPS_IN_CI set to `allowed`."""
  conftest = open(os.path.join(ROOT, 'tests', 'conftest.py')).read()
  assert 'ALLOWED_SKIPS_IN_CI = {}\n' in conftest
  if allowed is not None:
    conftest = conftest.replace('ALLOWED_SKIPS_IN_CI = {}\n', f'ALLOWED_SKIPS_IN_CI = {allowed!r}\n')
  (tmp_path / 'conftest.py').write_text(conftest)
  (tmp_path / 'test_needs_a_browser.py').write_text(source)
  result = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, CI=ci, PYTHONPATH=ROOT), timeout=120)
  return result.returncode, result.stdout


def passed(code):
  """Whether pytest's exit code lets CI pass (5: nothing ran, as when the one module skips)."""
  return code in (0, 5)


@pytest.mark.parametrize('ci, outcome', [('true', '1 failed'), ('', '1 skipped')])
def test_a_skip_fails_only_under_ci(tmp_path, ci, outcome):
  code, out = scratch_pytest(tmp_path, SKIP, ci)
  assert outcome in out and passed(code) != bool(ci), out
  if ci:
    assert 'skipped under CI=true (Skipped: chromium is not installed)' in out


@pytest.mark.parametrize('ci, outcome', [('true', '1 error'), ('', '1 skipped')])
def test_a_skip_at_collection_fails_only_under_ci(tmp_path, ci, outcome):
  code, out = scratch_pytest(tmp_path, COLLECTION_SKIP, ci)
  assert outcome in out and passed(code) != bool(ci), out
  if ci:
    assert ("test_needs_a_browser.py skipped at collection under CI=true (Skipped: could not "
            "import 'no_such_module_here'") in out


@pytest.mark.parametrize('ci, outcome', [('true', '1 failed'), ('', '1 xfailed')])
def test_an_xfail_fails_only_under_ci(tmp_path, ci, outcome):
  code, out = scratch_pytest(tmp_path, XFAIL, ci)
  assert outcome in out and passed(code) != bool(ci), out
  if ci:
    assert 'xfailed under CI=true (known to fail)' in out


@pytest.mark.parametrize('source, node, outcome', [
    (SKIP, 'test_needs_a_browser.py::test_page', '1 skipped'),
    (COLLECTION_SKIP, 'test_needs_a_browser.py', '1 skipped'),
    (XFAIL, 'test_needs_a_browser.py::test_page', '1 xfailed')])
def test_a_listed_skip_stays_a_skip_under_ci(tmp_path, source, node, outcome):
  code, out = scratch_pytest(tmp_path, source, 'true', {node: 'needs what CI lacks'})
  assert outcome in out and passed(code), out
