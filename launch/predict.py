"""Writes WORKDIR/submission.csv (row_id,target in the order of DATA/test.csv).

  python -m launch.predict --config configs/grapheme.py:kaggle --data DATA --workdir DIR
"""

from launch import cli, flags


def main(argv):
  del argv
  from bengrapheme import console, errors, restored, train
  config = flags.config()
  if not hasattr(train.load_task(config), 'predict'):
    raise errors.UserError(f'{config.task} has no predictor (it has no submission format); '
                     'python -m launch.evaluate writes its scores and exports')
  task, model = restored.trained_model(config, flags.WORKDIR.value)
  console.show(task.predict(config, model, flags.WORKDIR.value))


if __name__ == '__main__':
  cli.run(main)
