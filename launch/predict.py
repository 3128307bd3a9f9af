"""Writes WORKDIR/submission.csv (row_id,target in the order of DATA/test.csv).

  python -m launch.predict --config configs/grapheme.py:kaggle --data DATA --workdir DIR
"""
from absl import app

from launch import flags


def main(argv):
  del argv
  from bengrapheme import train
  config = flags.config()
  task, model = train.trained_model(config, flags.WORKDIR.value)
  if not hasattr(task, 'predict'):
    raise SystemExit(f'{config.task} has no predictor (no submission format): use '
                     'python -m launch.evaluate for its scores and exports')
  print(task.predict(config, model, flags.WORKDIR.value))


if __name__ == '__main__':
  app.run(main)
