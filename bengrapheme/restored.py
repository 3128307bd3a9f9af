"""Evaluation and prediction outside training (launch.evaluate, launch.predict), as
big_vision's tools/eval_only.py: the newest checkpoint of a workdir restored read-only (a
training run may be writing it), every evaluator of config.evals scored (or those named), the
report written and the headline tables shown.
"""
import json
import textwrap

import jax

from bengrapheme import (checkpoint, console, inference, evaluators, files, parallel, report,
                         train)


def trained_model(config, workdir):
  """(task, inference.TrainedModel) from the newest checkpoint in `workdir`."""
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
  return task, train.trained_model(graphdef, restored, mesh, step, task)


def evaluate(config, workdir, names=None):
  """Scores every evaluator of config.evals (or of `names`); writes workdir/eval/metrics.json
  and the page people look at, workdir/eval/report.html, then prints each one's headline
  scores. Returns what metrics.json holds: the step, and each evaluator's scores with flat
  'a/b/c' keys under its name."""
  task, model = trained_model(config, workdir)
  metrics, sections, summaries = {'step': model.step}, [], {}
  skipped = {}
  chosen = evaluators.make(config, task, workdir, names, skipped)
  tune = config.eval.tune_split
  if tune and tune not in chosen:
    console.say(f'eval.tune_split={tune!r} is not evaluated here: the others apply no '
                'chosen post-processing.')

  def keep(name, evaluator, scores, details):
    metrics[name] = inference.flatten(scores)
    summaries[name] = evaluator.summary(scores)
    console.say(f'Drawing the report of {name!r}...')
    sections.extend(evaluator.report_sections(scores, details))

  evaluators.run(config, chosen, model, keep)
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
