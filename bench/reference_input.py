"""The training stream as bengrapheme/input.py built it before it read whole batches (issue
38): grain's shuffle / repeat / mix / batch datasets for the order, and every record read on
its own (`source[i]`, a dict each) and stacked.

Kept as the reference that bench/input_pipeline.py times the batched reader against and
tests/grapheme/test_batched_input.py compares its batches with: both must give the same
arrays in the same order.
"""
import grain
import numpy as np

from bengrapheme import input as input_lib


def train_dataset(source, *, batch_size, seed, process_index, process_count,
                  num_threads=8, mixed_in=None, mixed_fraction=0.0):
  """input.train_dataset's batches, the per-record way."""
  if len(source) < batch_size * process_count:
    raise ValueError(f'training set of {len(source)} examples is smaller than one global '
                     f'batch ({batch_size * process_count})')
  # The stream of indices, `mixed_in`'s after `source`'s: shuffling and mixing look only at
  # the lengths, so these are the positions the records themselves would take.
  n = len(source)
  indices = grain.MapDataset.range(n).shuffle(seed=seed).repeat()
  if mixed_fraction:
    if not 0 < mixed_fraction < 1 or mixed_in is None or len(mixed_in) == 0:
      raise ValueError(f'mixed_fraction {mixed_fraction} needs a non-empty mixed_in source '
                       'and a fraction in (0, 1)')
    extra = grain.MapDataset.range(n, n + len(mixed_in)).shuffle(seed=seed + 1).repeat()
    indices = grain.MapDataset.mix([indices, extra], [1 - mixed_fraction, mixed_fraction])

  def read(rows):
    records = [source[i] if i < n else mixed_in[i - n] for i in rows.tolist()]
    return {k: np.stack([r[k] for r in records]) for k in records[0]}

  return input_lib.train_stream(indices.batch(batch_size * process_count), read,
                                local_batch=batch_size, process_index=process_index,
                                num_threads=num_threads)
