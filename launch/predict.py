"""Writes WORKDIR/submission.csv (row_id,target in the order of DATA/test.csv).

  python -m launch.predict --config configs/grapheme.py:kaggle --data DATA --workdir DIR
"""
from absl import app

from launch import flags


def main(argv):
  del argv
  from bengrapheme import train
  config = flags.config()
  task, mesh, graphdef, variables, _ = train.load_trained(config, flags.WORKDIR.value)
  print(task.predict(config, graphdef, variables, mesh, flags.WORKDIR.value))


if __name__ == '__main__':
  app.run(main)
