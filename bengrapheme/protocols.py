"""What a task module, its model, its sampler and its evaluators provide: the seams a new task
plugs into, written as typing.Protocols. train.load_task checks a task module,
train.init_state its model and bengrapheme/evaluators.py each evaluator when they are made,
naming in one line what is missing.

A task is a module named by `config.task`; docs/adding-a-task.md walks through adding one.
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

  def make_model(self, config, rngs) -> 'Model':
    """The nnx.Module (a Model)."""

  def loss(self, model, batch, key, config) -> tuple[Any, dict]:
    """(scalar loss, {name: scalar} logged with it) on one batch, inside the jitted step."""

  # And EVALUATORS: {name: callable(config, split, workdir) -> Evaluator}, the evaluators
  # config.evals.NAME.type may name (bengrapheme/evaluators.py); a callable raises
  # inference.Unlabelled when its split has nothing to score.

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
    """Writes the submission file from an inference.TrainedModel; returns its path."""


class DataInit(Protocol):
  """Optional: parameters that start from the data (k-means centres of a pooling layer)."""

  def init_from_data(self, config, workdir, graphdef, state, mesh) -> Any:
    """The train state of a fresh run, changed where the data says (e.g. parameters fitted
    on features of training examples); called once, before the first step, never on a
    resume (the checkpoint carries what it set)."""


class Labels(Protocol):
  """Optional: data whose splits can have no labels at all (a collection's images): the
  task says so when config.evals has nothing it can score."""

  def unscorable(self, config, names) -> str:
    """Why none of config.evals `names` can be scored with this config, and what to do
    (flags that work as written); '' when the data can have labels (the trainer then asks
    for a labelled split)."""


class FineTunes(Protocol):
  """Optional: a task whose model.init_from may name the workdir of another of the
  project's runs (a pre-training)."""

  def init_from_advice(self, config) -> str:
    """How to make the workdir config.model.init_from names (the command that trains it),
    said when it does not exist."""


class Features(Protocol):
  """Optional: what a probe of the model's features reads (an evaluator that scores the
  backbone as it is, with no head)."""

  def features(self, model, images) -> Any:
    """[B, D] float32 features of a batch of preprocessed images, in eval mode."""


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


class Model(Protocol):
  """What the trainer, fine-tuning and cross-task evaluators call on a task's model."""

  backbone: Any  # an nnx.Module: model.init_from loads into it

  def __call__(self, inputs, train: bool) -> Any:
    """What `loss` and the task's evaluators read; train=False in evaluation (BatchNorm's
    running statistics, no dropout)."""


class Sampler(Protocol):
  """The record order of a training stream (input.train_stream): a pure function of the
  batch number, so the iterator's state is that number and a resumed run reads exactly what
  an uninterrupted one would."""

  def __len__(self) -> int:
    """The number of global batches (a large number for an endless stream)."""

  def __getitem__(self, batch: int) -> Any:
    """The record indices (int array [global batch]) of global batch `batch`."""


class Evaluator(Protocol):

  def run(self, model, chosen=None, tune=False) -> tuple[dict, Any]:
    """(scores, details) of an inference.TrainedModel: scores a nested dict of floats with
    the headline under 'score'; details whatever report_sections draws.
    tune: this is eval.tune_split's evaluator; it puts the post-processing settings it
    chooses in scores['tuned_settings']. chosen: those settings, when another evaluator
    of the round chose them (to apply and report as 'tuned'); None when nothing was
    chosen. An evaluator with nothing to choose ignores both."""

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
  dunders = ('__call__', '__len__', '__getitem__')
  return [m for m, v in vars(protocol).items()
          if callable(v) and (not m.startswith('_') or m in dunders)]


def check(obj, protocol, name):
  """Raises SeamError naming every method and attribute of `protocol` that `obj` (called
  `name`) lacks."""
  wanted = _methods(protocol) + list(getattr(protocol, '__annotations__', {}))
  missing = [m for m in _methods(protocol) if not callable(getattr(obj, m, None))]
  missing += [a for a in getattr(protocol, '__annotations__', {}) if not hasattr(obj, a)]
  if missing:
    raise SeamError(f'{name} lacks {", ".join(missing)}; bengrapheme/protocols.py\'s '
                    f'{protocol.__name__} provides {", ".join(wanted)}')
  return obj
