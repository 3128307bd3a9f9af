"""Bengali.AI (Kaggle bengaliai-cv19) as a TFDS dataset in ArrayRecord files, built and read
without TensorFlow.

  python -m bengrapheme.grapheme.tfds_bengaliai --manual_dir DATA --data_dir TFDS_DIR

builds TFDS_DIR/bengaliai/1.0.0/ from a Kaggle folder (or a synthetic one). Training reads it
with `--config.data.format=tfds --config.data.tfds_dir=TFDS_DIR`.

Not `tfds build`: the tfds CLI imports TensorFlow at start-up (its convert_format command
needs `tf.train.Example`), which this project does not install; the builder itself needs none.

Records are in the canonical order of `kaggle.validate` (train.csv order; test in the order
of first appearance in test.csv), so record i is row i of the prepared npy layout and the
validation hold-out is the same in both formats.
"""
import argparse
import functools
import os
import tempfile

import numpy as np
import tensorflow_datasets as tfds

from bengrapheme.grapheme import classes, kaggle, prepare

NAME = 'bengaliai'


class Bengaliai(tfds.core.GeneratorBasedBuilder):
  """Bengali.AI handwritten graphemes: a 137x236 image -> root, vowel and consonant labels."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Kaggle bengaliai-cv19 layout, raw uint8 pixels.'}
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Download the Kaggle competition files (`kaggle competitions download -c bengaliai-cv19`)
  and unzip them into one folder: train.csv, train_image_data_{0..3}.parquet, test.csv,
  test_image_data_{0..3}.parquet. Pass that folder as manual_dir. A synthetic folder from
  `python -m bengrapheme.grapheme.synth` works too (its test_labels.csv labels the test split).
  """

  def _info(self):
    label = tfds.features.Scalar(np.int32, doc='-1 where unknown (Kaggle test split)')
    return tfds.core.DatasetInfo(
        builder=self,
        description='Handwritten Bengali graphemes; pixel 0 is black ink, 255 white paper.',
        features=tfds.features.FeaturesDict({
            # Raw pixels, not tfds.features.Image: encoding a numpy image needs TensorFlow,
            # and the bytes are read back as they are, with no decoding.
            'image': tfds.features.Tensor(shape=(kaggle.HEIGHT, kaggle.WIDTH), dtype=np.uint8,
                                          encoding=tfds.features.Encoding.BYTES),
            'image_id': tfds.features.Text(),
            **{name: label for name in kaggle.COMPONENTS},
            'grapheme': tfds.features.Text(doc="'' where unknown"),
        }),
        # Record i stays row i of the canonical order (see the module docstring).
        disable_shuffling=True,
        homepage='https://www.kaggle.com/c/bengaliai-cv19',
    )

  def _split_generators(self, dl_manager):
    return {split: self._generate_examples(dl_manager, split) for split in kaggle.SPLITS}

  def _generate_examples(self, dl_manager, split):
    # The project's own prepare step validates the files (same DataError messages as
    # training from the Kaggle folder) and converts the wide parquet files into row-major
    # pixels without holding a split in memory; the copy lives only while this split builds.
    os.makedirs(dl_manager.download_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dl_manager.download_dir) as tmp:
      src = prepare.GraphemeSource(prepare.prepare(dl_manager.manual_dir, split, tmp))
      for i in range(len(src)):
        record = src[i]
        yield i, {'image': record['image'], 'image_id': src.image_ids[i],
                  **dict(zip(kaggle.COMPONENTS, record['labels'])),
                  'grapheme': src.graphemes[i]}


def build(manual_dir, data_dir):
  """Builds (or finds already built) TFDS_DIR/bengaliai in ArrayRecord files."""
  builder = Bengaliai(data_dir=data_dir, file_format='array_record')
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder


class TfdsGraphemeSource:
  """prepare.GraphemeSource's records (same keys, dtypes and shapes) from a TFDS build.

  A grain random-access source over the build's data source (what `tfds.data_source`
  returns), which reads the ArrayRecord files with no TensorFlow.
  """

  def __init__(self, data_dir, split):
    builder = Bengaliai(data_dir=data_dir)
    if not builder.is_prepared():
      raise FileNotFoundError(f'{data_dir}: no {NAME} TFDS build; make one with `python -m '
                              f'bengrapheme.grapheme.tfds_bengaliai --manual_dir DATA '
                              f'--data_dir {data_dir}`')
    self.records = builder.as_data_source(split)  # what tfds.data_source returns

  def __len__(self):
    return len(self.records)

  def __getitem__(self, index):
    index = int(index)
    if not 0 <= index < len(self):
      raise IndexError(f'index {index} out of range for {len(self)} images')
    record = self.records[index]
    return dict(image=record['image'],
                labels=np.array([record[name] for name in kaggle.COMPONENTS], np.int32),
                grapheme=np.int32(classes.grapheme_id(record['grapheme'].decode('utf-8'))),
                index=np.int32(index))

  @functools.cached_property
  def labels(self):
    """int32 [N, 3] in record order; reads every record (ArrayRecord has no column reads)."""
    return np.array([[record[name] for name in kaggle.COMPONENTS] for record in self.records],
                    np.int32).reshape(-1, 3)

  @functools.cached_property
  def image_ids(self):
    """In record order; reads every record, so only predict (on the test split) asks."""
    return [record['image_id'].decode('utf-8') for record in self.records]

  def __repr__(self):
    return f'TfdsGraphemeSource({self.records!r})'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--manual_dir', required=True,
                      help='the Kaggle bengaliai-cv19 folder (or a synthetic one)')
  parser.add_argument('--data_dir', required=True, help='TFDS data dir to write into')
  args = parser.parse_args()
  builder = build(args.manual_dir, args.data_dir)
  print(f'{builder.data_dir}: ' + ', '.join(
      f'{name} {split.num_examples}' for name, split in builder.info.splits.items()))


if __name__ == '__main__':
  main()
