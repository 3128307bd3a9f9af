"""What the checkpoints' CRC32s cost: a save of the kaggle config's train state
(EfficientNet-B3 parameters, Adam moments and EMA) with them, as bengrapheme/checkpoint.py
saves, against the same save without them (the code before), each until written.

  python -m bench.checkpoint_save [--quick]
"""
import sys
import tempfile

import jax
import orbax.checkpoint as ocp

from bench import common
from bengrapheme import checkpoint, parallel, train


def save_without_checksums(mngr, step, state):
  """checkpoint.save as it was before the CRC32s."""
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)


def run(quick):
  from configs import grapheme
  config = grapheme.get_config('test' if quick else 'kaggle')
  task = train.load_task(config)
  mesh = parallel.make_mesh(config.mesh)
  _, state = train.init_state(config, task, mesh, pretrained=False)
  size = sum(x.nbytes for x in jax.tree.leaves(state))
  print(f'train state: {size / 1e6:,.0f} MB', file=sys.stderr)
  steps = iter(range(1, 10**6))
  with tempfile.TemporaryDirectory() as folder:
    mngr = checkpoint.manager(folder, keep=1)

    def timed(save):
      def once():
        save(mngr, next(steps), state)
        mngr.wait_until_finished()
      return once

    turns = common.interleaved({
        'with': timed(lambda m, s, st: checkpoint.save(m, s, st, force=True)),
        'without': timed(save_without_checksums)}, common.MIN_REPEATS)
    mngr.close()
  recipe = 'test' if quick else 'kaggle'
  return [common.timed_record(
      f'checkpoint save with CRC32s of every array ({recipe} config state)', 's',
      'the same save without them', turns,
      lambda t: (t['with'], t['without'], t['without'] / t['with']),
      note=f'{size / 1e6:,.0f} MB of parameters, Adam moments and EMA, 1 CPU device, '
           'each save waited for until written')]


if __name__ == '__main__':
  common.main(__doc__, run)
