"""Evaluation and prediction outside training (launch.evaluate, launch.predict), as
big_vision's tools/eval_only.py: the newest checkpoint of a workdir restored read-only (a
training run may be writing it), every split of config.eval.splits scored, the report
written and the headline tables shown.
"""
import json
import textwrap

import jax

from bengrapheme import checkpoint, console, evaluation, files, parallel, report, train


def trained_model(config, workdir):
  """(task, evaluation.TrainedModel) from the newest checkpoint in `workdir`."""
  checkpoint.require(workdir)  # before the model is built, which takes a while
  task = train.load_task(config)
  mesh = parallel.make_mesh(config.mesh)
  graphdef, state = train.init_state(config, task, mesh, pretrained=False)
  # Read-only: this may run while a training run writes the workdir (it holds the lock).
  ckpt = checkpoint.manager(workdir, keep=config.train.keep_checkpoints, read_only=True)
  step, restored = checkpoint.restore(ckpt, checkpoint.abstract(state), read_only=True)
  ckpt.close()
  if restored is None:
    raise checkpoint.NoCheckpoint(f'no checkpoint in {checkpoint.directory(workdir)}: train '
                                  f'first (python -m launch.train ... --workdir {workdir})')
  console.say(f'Using the checkpoint of step {step} ({checkpoint.directory(workdir)}/{step}), '
              'the newest complete one.')
  return task, evaluation.TrainedModel(train.apply_fn(graphdef), train.eval_variables(restored),
                                       mesh, step)


def evaluate(config, workdir):
  """Scores every split in config.eval.splits; writes workdir/eval/metrics.json and the page
  people look at, workdir/eval/report.html, then prints each split's headline scores.
  Returns what metrics.json holds: the step, and each split's scores with flat 'a/b/c' keys."""
  task, model = trained_model(config, workdir)
  metrics, sections, summaries = {'step': model.step}, [], {}
  skipped = {}
  for split, evaluator in train.evaluators(config, task, workdir, skipped).items():
    console.say(f'Scoring split {split!r}...')
    scores, details = evaluator.run(model)
    metrics[split] = evaluation.flatten(scores)
    summaries[split] = evaluator.summary(scores)
    console.say(f'Drawing the report of split {split!r}...')
    sections += evaluator.report_sections(scores, details)
  if skipped:
    metrics['skipped'] = skipped
  if jax.process_index() == 0:
    path = files.write_atomic(files.join(workdir, 'eval', 'metrics.json'),
                              json.dumps(metrics, indent=2, sort_keys=True))
    page = report.write(config, workdir, model.step, sections)
    for split, (header, rows, note) in summaries.items():
      console.show(f'\n{split} (step {model.step:,}):\n{console.text_table(header, rows)}\n'
                   f'{textwrap.fill(note, 96)}')
    console.show(f'\nEvery score: {path}\nCharts and examples: {page}')
  return metrics
