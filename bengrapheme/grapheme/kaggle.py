"""The Bengali.AI (Kaggle bengaliai-cv19) file layout: constants, writer, reader.

Images are stored "wide": one parquet row per image, column `image_id` plus 32,332 uint8
pixel columns named '0'..'32331' (row-major 137x236, 0 = black ink, 255 = white paper).
"""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HEIGHT, WIDTH = 137, 236
NUM_PIXELS = HEIGHT * WIDTH
PIXEL_COLUMNS = [str(i) for i in range(NUM_PIXELS)]
COMPONENTS = ('grapheme_root', 'vowel_diacritic', 'consonant_diacritic')
NUM_CLASSES = (168, 11, 7)
NUM_SHARDS = 4  # train_image_data_{0..3}.parquet, test_image_data_{0..3}.parquet


def image_parquet_name(split, shard):
  return f'{split}_image_data_{shard}.parquet'


def write_image_parquet(path, image_ids, images):
  """Writes images [N, 137, 236] uint8 in the Kaggle wide layout, one row group."""
  images = np.asarray(images)
  if images.dtype != np.uint8 or images.shape[1:] != (HEIGHT, WIDTH):
    raise ValueError(f'{path}: expected uint8 images [N, {HEIGHT}, {WIDTH}], got '
                     f'{images.dtype} {images.shape}')
  flat = images.reshape(len(images), NUM_PIXELS)
  columns = [pa.array(list(image_ids), pa.string())]
  columns += [pa.array(flat[:, i]) for i in range(NUM_PIXELS)]
  table = pa.Table.from_arrays(columns, names=['image_id'] + PIXEL_COLUMNS)
  pq.write_table(table, path, row_group_size=max(len(images), 1))
