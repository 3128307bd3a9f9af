"""What a task module and its evaluators provide: the seams a new task plugs into, written as
typing.Protocols. train.load_task checks a task module and train.evaluators each evaluator
when they are made, naming in one line what is missing.

A task is a module named by `config.task` (bengrapheme/grapheme/task.py, retrieval/task.py).
"""
from typing import Any, Protocol

from bengrapheme import errors


class Task(Protocol):

  def check_data(self, config) -> None:
    """Raises a DataError (an errors.UserError) at once when the training data is missing:
    called before the trainer takes its workdir, so it must be quick."""

  def train_data(self, config, workdir, local_batch) -> Any:
    """A grain IterDataset of this process's `local_batch`-row batches, endless; its
    iterator state is checkpointed with the train state."""

  def make_model(self, config, rngs) -> Any:
    """The nnx.Module; `model(images, train=...)` gives what `loss` and the evaluator read."""

  def loss(self, model, batch, key, config) -> tuple[Any, dict]:
    """(scalar loss, {name: scalar} logged with it) on one batch, inside the jitted step."""

  def evaluator(self, config, split, workdir) -> 'Evaluator':
    """The evaluator of `split`; raises evaluation.Unlabelled when it has nothing to score."""

  def random_batch(self, config, local_batch) -> dict:
    """Random data with train_data's keys, shapes and dtypes (launch.train --dry_run's)."""


class Validates(Protocol):
  """Optional: the task's own config checks, run by train.load_task (so by every entry point,
  before any data work)."""

  def validate(self, config) -> None:
    """Raises errors.ConfigError naming the field's path and its allowed values at the first
    value this task cannot run; quick and without side effects."""


class Predictor(Protocol):
  """Optional: a task with a submission format (launch.predict)."""

  def predict(self, config, model, workdir) -> str:
    """Writes the submission file from an evaluation.TrainedModel; returns its path."""


class DataInit(Protocol):
  """Optional: parameters that start from the data (NetRVLAD's k-means centres)."""

  def init_from_data(self, config, workdir, graphdef, state, mesh) -> Any:
    """The train state of a fresh run, changed where the data says (e.g. parameters fitted
    on features of training examples); called once, before the first step, never on a
    resume (the checkpoint carries what it set)."""


class CoupledLoss(Protocol):
  """Optional: a loss over the whole batch, not a mean over its rows (a metric-learning loss
  over a P x K batch). Then `loss` is batch_loss(embed(...)), and gradient accumulation
  (train.grad_accum_steps) computes embed in chunks and batch_loss on all of them at once
  (train.make_train_step's gradient caching) instead of one loss per micro-batch."""

  def embed(self, model, batch, key, config) -> Any:
    """Per-row outputs (a pytree of [B, ...] arrays) of the augmented batch; row i depends
    on batch row i alone."""

  def batch_loss(self, outputs, batch, config) -> tuple[Any, dict]:
    """(scalar loss, {name: scalar}) of the whole batch's outputs."""


class Evaluator(Protocol):

  def run(self, model) -> tuple[dict, Any]:
    """(scores, details) of an evaluation.TrainedModel: scores a nested dict of floats with
    the headline under 'score'; details whatever report_sections draws."""

  def headline(self, scores) -> str:
    """One line saying what 'score' is and its value (logged at evaluations in training)."""

  def summary(self, scores) -> tuple[tuple, list, str]:
    """(header, rows, note): the headline scores as a small table and what its columns
    are, which launch.evaluate shows last."""

  def report_sections(self, scores, details) -> list:
    """bengrapheme.report.Html sections of the evaluation report."""


class SeamError(errors.UserError, TypeError):
  """A task module or evaluator lacks what its protocol names."""


def implements(obj, protocol):
  """Whether `obj` has every method of an optional `protocol`."""
  return all(callable(getattr(obj, m, None)) for m in _methods(protocol))


def _methods(protocol):
  return [m for m, v in vars(protocol).items() if callable(v) and not m.startswith('_')]


def check(obj, protocol, name):
  """Raises SeamError naming every method of `protocol` that `obj` (called `name`) lacks."""
  wanted = _methods(protocol)
  missing = [m for m in wanted if not callable(getattr(obj, m, None))]
  if missing:
    raise SeamError(f'{name} lacks {", ".join(missing)}; bengrapheme/protocols.py\'s '
                    f'{protocol.__name__} provides {", ".join(wanted)}')
  return obj
