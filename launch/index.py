"""Indexes a folder of fragment images with a trained encoder, for launch.search.

  python -m launch.index --workdir W --collection DIR
  python -m launch.index --workdir W --manifest MANIFEST.json|URL [--iiif_size 1500]

The config is the one W's training run recorded (W/config.json), or --config's.

Every image under DIR (nested folders, any names; jpg, png or tif; colour or grey; black,
white or transparent outside the fragment) gets the fragment descriptor of the workdir's
newest checkpoint, with the post-processing the val split chose for it (the config's own
settings, said so, when no choice is recorded; retrieval/collections/index.py). The index
goes to WORKDIR/index (or --index). Rerun after adding or removing images: only new or
changed ones are embedded. An image that cannot be read is
named, counted and left out. A IIIF manifest's canvas images are fetched once into
W/iiif/ with their shelfmarks and canvas IRIs (retrieval/collections/iiif.py), then indexed
as that folder.
"""
import os

from absl import flags

from launch import cli, flags as launch_flags

COLLECTION = flags.DEFINE_string(
    'collection', None, 'The folder of fragment images to index (nested folders, any names).')
MANIFEST = flags.DEFINE_string(
    'manifest', None, 'Instead of --collection: a IIIF Presentation manifest (3.0 or 2.1; a '
    'file or an http(s) URL) whose canvases are fetched into WORKDIR/iiif, then indexed.')
IIIF_SIZE = flags.DEFINE_integer('iiif_size', 1500, 'With --manifest: pixels on the longest '
                                 'side of each image fetched.')
INDEX = flags.DEFINE_string('index', None, 'The index folder (default: WORKDIR/index).')
flags.mark_flags_as_mutual_exclusive(['collection', 'manifest'], required=True)


def main(argv):
  del argv
  from bengrapheme import console, errors, restored, files
  from retrieval.collections import collection, index
  config = launch_flags.config(from_workdir=True)
  if config.task != 'retrieval.fragments.task':
    raise errors.UserError(f'{config.task}: launch.index indexes fragment images; give a '
                           'fragment config (configs/fragments.py:...)')
  workdir = launch_flags.WORKDIR.value
  folder = INDEX.value or os.path.join(workdir, 'index')
  if files.is_bucket(folder):
    raise errors.UserError(f'{folder}: an index is written to a local folder; pass --index DIR')
  source = COLLECTION.value
  if MANIFEST.value:  # fetched (or found fetched) before the model, which takes a while
    from retrieval.collections import iiif
    source = iiif.fetch(MANIFEST.value, workdir, IIIF_SIZE.value)
  listing = collection.list_images(source)  # before the model, which takes a while
  _, model = restored.trained_model(config, workdir)
  built, counts = index.build(config, model, workdir, listing, folder)
  console.show(
      f'Indexed {len(built.entries.paths):,} images of {listing.root} into '
      f'{os.path.join(folder, "index.npz")}: {counts["embedded"]:,} embedded now, '
      f'{counts["reused"]:,} kept from the index before, {counts["dropped"]:,} no longer in '
      f'the folder dropped, {counts["unreadable"]:,} unreadable (named above).')


if __name__ == '__main__':
  cli.run(main)
