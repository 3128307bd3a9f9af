"""Scale augmentation (input.scales) and its test-time counterpart (input.eval_scales): a
fragment's patches are those of the fragment at each scale, the native ones unchanged, and
SRS-LBP stays the native fragment's."""
import numpy as np
import pytest

from configs import fragments
from retrieval.fragments import data


def _source(fragment_data, tmp_path, split, **scales):
  config = fragments.get_config('test')
  config.data.dir = fragment_data
  config.data.cache_dir = str(tmp_path)
  config.input.update(scales)
  return data.source(config, str(tmp_path), split)


@pytest.mark.slow
def test_a_fragment_holds_its_patches_at_every_scale(fragment_data, tmp_path):
  native = _source(fragment_data, tmp_path, 'test')
  both = _source(fragment_data, tmp_path, 'test', eval_scales=(1.0, 1.5))
  assert both.names == native.names
  n = np.diff(native.starts)
  assert (np.diff(both.starts) > n).all()  # a larger fragment has more to cut
  for f in (0, len(n) - 1):  # the native patches first, as they were, then others
    first = both.patches()[both.starts[f]:both.starts[f] + n[f]]
    assert np.array_equal(first, native.patches()[native.starts[f]:native.starts[f + 1]])
    assert not np.array_equal(both.patches()[both.starts[f] + n[f]:][:n[f]], first)
  assert np.array_equal(both.lbp(), native.lbp())
  assert native.path != both.path  # its own cache entry
  # The native caches keep the keys they had before scales existed.
  assert 'scales' not in data.patch_params(fragments.get_config('test'), 'test')
