"""HisFrag20 as a TFDS dataset in ArrayRecord files, built and read without TensorFlow.

  python -m retrieval.fragments.tfds_hisfrag20 --manual_dir DATA --data_dir TFDS_DIR

builds TFDS_DIR/hisfrag20/1.0.0/ from DATA/train/ and DATA/test/ folders of WID_PID_FID.jpg
fragments. Training reads it with `--config.data.format=tfds --config.data.tfds_dir=TFDS_DIR`.
(Not `tfds build`: the tfds CLI imports TensorFlow at start-up; the builder needs none.)

Each record holds the JPEG file's bytes as they are (no re-encoding, so decoding them gives
the pixels the folder gives) with the ids from its name. Records are in the order of
`reader.list_fragments`, and the dataset's metadata lists every split's file names in that
order, so a split's listing (writers, pages, dense ids) is known without reading its records.
"""
import argparse
import os

import numpy as np
import tensorflow_datasets as tfds

from retrieval.fragments import reader

NAME = 'hisfrag20'
SPLITS = ('train', 'test')


class Hisfrag20(tfds.core.GeneratorBasedBuilder):
  """ICFHR 2020 HisFrag20: fragments of historical manuscript pages, by writer and page."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'The HisFrag20 folders; the JPEG bytes as shipped.'}
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Download HisFrag20 from Zenodo (doi 10.5281/zenodo.3893807) and unzip it so that one
  folder holds train/ and test/ folders of WID_PID_FID.jpg fragments. Pass that folder as
  manual_dir. A synthetic folder from `python -m retrieval.synthetic.synth` works too.
  """

  def _info(self):
    ids = tfds.features.Scalar(np.int64)
    return tfds.core.DatasetInfo(
        builder=self,
        description='Colour JPEG fragments, black outside the fragment, named by writer, '
                    'page and fragment id.',
        features=tfds.features.FeaturesDict({
            # Stored as the file's bytes: no TensorFlow to encode, none to read them back.
            'image': tfds.features.Image(shape=(None, None, 3), encoding_format='jpeg'),
            'writer': ids, 'page': ids, 'fragment': ids,
            'file_name': tfds.features.Text(),
        }),
        disable_shuffling=True,  # record i stays fragment i of the listing
        metadata=tfds.core.MetadataDict(),
        homepage='https://doi.org/10.5281/zenodo.3893807',
    )

  def _split_generators(self, dl_manager):
    # Both listings are checked before any record is written: a stray or misnamed file
    # fails the build at once, with the reader's message.
    listings = {split: reader.list_fragments(os.path.join(dl_manager.manual_dir, split))
                for split in SPLITS}
    for split, fragments in listings.items():
      self.info.metadata[split] = [os.path.basename(f.path) for f in fragments]
    return {split: self._generate_examples(fragments) for split, fragments in listings.items()}

  def _generate_examples(self, fragments):
    for i, fragment in enumerate(fragments):
      with open(fragment.path, 'rb') as f:
        data = f.read()
      reader.decode(fragment.path, data)  # empty, unreadable or all black: the reader's error
      yield i, {'image': data, 'writer': fragment.writer, 'page': fragment.page,
                'fragment': fragment.fragment, 'file_name': os.path.basename(fragment.path)}


def build(manual_dir, data_dir):
  """Builds (or finds already built) TFDS_DIR/hisfrag20 in ArrayRecord files."""
  builder = Hisfrag20(data_dir=data_dir, file_format='array_record')
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder


class TfdsFragmentSource(reader.FragmentSource):
  """reader.FragmentSource over a split of the TFDS build instead of a folder.

  Same records; `record_files` are the split's ArrayRecord files. Errors name a fragment as
  TFDS_DIR/hisfrag20/1.0.0/SPLIT/WID_PID_FID.jpg.
  """

  def __init__(self, data_dir, split, size, color=True):
    builder = Hisfrag20(data_dir=data_dir)
    if not builder.is_prepared():
      raise FileNotFoundError(f'{data_dir}: no {NAME} TFDS build; make one with `python -m '
                              f'retrieval.fragments.tfds_hisfrag20 --manual_dir DATA '
                              f'--data_dir {data_dir}`')
    folder = os.path.join(builder.data_dir, split)
    fragments = [reader.Fragment(os.path.join(folder, name), *reader.parse_name(name))
                 for name in builder.info.metadata[split]]
    super().__init__(folder, size, color, fragments)
    # What tfds.data_source returns; the image stays the JPEG bytes, which decode() checks
    # and decodes exactly as it does a file.
    self.records = builder.as_data_source(split, decoders={'image': tfds.decode.SkipDecoding()})
    self.record_files = [os.fspath(path) for path in builder.info.splits[split].filepaths]

  def read_rgb(self, index):
    return reader.decode(self.fragments[index].path, self.records[index]['image'])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--manual_dir', required=True,
                      help='folder with train/ and test/ folders of WID_PID_FID.jpg fragments')
  parser.add_argument('--data_dir', required=True, help='TFDS data dir to write into')
  args = parser.parse_args()
  builder = build(args.manual_dir, args.data_dir)
  print(f'{builder.data_dir}: ' + ', '.join(
      f'{name} {split.num_examples}' for name, split in builder.info.splits.items()))


if __name__ == '__main__':
  main()
