"""The fragments' validation family (retrieval/synthetic/synth_val.py): the layout the reader reads, one
output per seed, and draws that share no font with training or with each other."""
import os

import numpy as np
import pytest

from retrieval.fragments import reader
from retrieval.synthetic import synth, synth_val

PAGE = (500, 700)  # small pages: the test stays fast


def _write(out, **kw):
  args = dict(writers=2, pages_per_writer=1, seed=0, draw='val', workers=1, page_size=PAGE)
  return synth_val.write_dataset(str(out), **{**args, **kw})


def _bytes(folder):
  return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


def test_the_reader_reads_it_and_a_seed_gives_one_output(tmp_path):
  counts = _write(tmp_path / 'a', train_writers=1)
  listed = reader.list_fragments(str(tmp_path / 'a' / 'test'))
  assert counts['test'] == len(listed) > 2 and counts['train'] >= 1
  assert {f.writer for f in listed} == {1001, 1002}  # apart from training's ids
  for f in listed[:3]:
    assert reader.decode(f.path).ndim == 3
  _write(tmp_path / 'b', train_writers=1, workers=2)
  assert _bytes(tmp_path / 'a' / 'test') == _bytes(tmp_path / 'b' / 'test')
  assert _bytes(tmp_path / 'a' / 'train') == _bytes(tmp_path / 'b' / 'train')
  _write(tmp_path / 'c', seed=1)
  assert _bytes(tmp_path / 'a' / 'test') != _bytes(tmp_path / 'c' / 'test')


def test_the_draws_share_no_font_with_training_or_each_other():
  demo = synth_val.demo_fonts()
  val = {f[1] for f in synth_val.draw_fonts('val')}
  third = {f[1] for f in synth_val.draw_fonts('third')}
  assert len(val) >= 10 and len(third) >= 10
  assert not val & demo and not third & demo and not val & third
  assert {f[1] for f in synth_val.draw_fonts('train')} == demo
  for writer in range(1, 3 * synth_val.HAND_SIZE + 1):
    assert synth_val.writer_style(0, 'val', writer)['font'] in val
    assert synth_val.writer_style(3, 'third', writer)['font'] in third


def test_writers_of_a_hand_share_it_with_personal_habits():
  first, second, other = (synth_val.writer_style(0, 'val', w)
                          for w in (1, 2, synth_val.HAND_SIZE + 1))
  assert first['font'] == second['font'] != other['font']
  assert first['slant'] != second['slant']
  assert abs(np.log(first['x_height'] / second['x_height'])) < 0.3


def test_pages_are_drawn_unlike_synth_py():
  scales = [synth_val.page_style(synth_val.writer_style(0, 'val', 1),
                                 np.random.default_rng(i))['scan_scale'] for i in range(200)]
  assert min(scales) < 0.65 and max(scales) > 1.5  # synth.py scans at 0.7-1.3x only
  page = synth_val.page_style(synth_val.writer_style(0, 'val', 1), np.random.default_rng(0))
  image, _ = synth.render_page(page, np.random.default_rng(0), *PAGE, pen=synth_val.nib(page))
  plain, _ = synth.render_page(page, np.random.default_rng(0), *PAGE)
  assert (image < plain - 30).sum() > 0.01 * image.size  # the nib adds ink


def test_bad_arguments_are_one_line_errors(tmp_path):
  with pytest.raises(ValueError, match="draw 'test'"):
    _write(tmp_path / 'x', draw='test')
  with pytest.raises(ValueError, match='writers >= 1'):
    _write(tmp_path / 'x', writers=0)
  assert not os.path.exists(tmp_path / 'x') or not os.listdir(tmp_path / 'x')


def test_the_family_ceiling_redraws_the_style_each_page_was_rendered_with(monkeypatch):
  """experiments/family_ceiling.py scores the styles the generators drew; if a _page_job's draws
  change, its ceiling would describe another draw."""
  from experiments import family_ceiling
  rendered = []

  def capture(style, rng, width, height, pen=None):
    rendered.append(style)
    raise StopIteration  # the style is all this test needs

  def habits(style, hand, pen):
    x = style['x_height']
    return [hand, style['slant'], np.log(style['tracking'] / x + 1),
            np.log(style['word_gap'] / x), np.log(style['line_gap'] / x),
            np.log(style['wobble'] / x + 1e-3), *pen, np.log(x * style['scan_scale'])]

  monkeypatch.setattr(synth, 'render_page', capture)
  for seed, draw, writer, page in ((0, 'val', 3, 4011), (1, 'third', 12, 8047)):
    with pytest.raises(StopIteration):
      synth_val._page_job(('unused', seed, draw, writer, page, PAGE, 85))
    style = rendered[-1]
    x = style['x_height']
    expected = habits(style, (writer - 1) // synth_val.HAND_SIZE + 1,
                      [style['nib_angle'], np.log(max(1, round(style['nib_width'] * x)) / x)])
    np.testing.assert_allclose(family_ceiling.page_habits(seed, draw, writer, page), expected)
  seed, writer, page = 0, 67, 265  # the own test's (retrieval/synthetic/synth.py)
  with pytest.raises(StopIteration):
    synth._page_job(('unused', None, seed, writer, page, None, PAGE))
  style = rendered[-1]
  hand = [f for _, f in synth.FONTS].index(synth.writer_font(seed, writer)) + 1
  expected = habits(style, hand, [style['stroke'] / style['x_height']])
  np.testing.assert_allclose(family_ceiling.page_habits(seed, 'synth', writer, page), expected)
