"""The model each client uses: its personalized one, or the global one.

A personalized model does not always help its client: on a writer with a
few examples of many classes, fine-tuning or a personal model can fall
below the global model, some clients to accuracy 0. What a client would
deploy is the model that does best on data it holds out: its own
validation split. `choose` evaluates every candidate model of each client
there (the global model first, then the method's personalized models) and
keeps the best, so a client falls back to the global model where
personalization does not help; recipes report it as the final kind
'validated' beside the raw ones, and `CHOICE_FILE` says, per client, which
candidate it uses and how each scored.

The rule: the lowest validation loss; among equals the highest validation
accuracy; among equals the earlier candidate (the global model first).
Loss rather than accuracy: a client's validation split may hold a dozen
examples, where accuracy moves in steps of one example and one lucky
example flips the choice, while the cross-entropy weighs how confident
each prediction is. A client without validation examples cannot choose:
it uses the last candidate that covers it (the method's own model).
"""

from collections.abc import Mapping, Sequence
import csv
import os
from typing import NamedTuple, Optional

from absl import logging

from tff_fair import files
from tff_fair.evaluation import per_client
from tff_fair.training import run_context as run_context_lib

CHOICE_FILE = 'personalization.csv'
# The final kind of the chosen models.
KIND = 'validated'


class Candidate(NamedTuple):
  """A model a client may use.

  Attributes:
    name: Its name in `CHOICE_FILE` (e.g. 'global', 'personalized').
    weights: One model for every client, or one per client.
    client_ids: The clients it covers (None: every client).
  """

  name: str
  weights: per_client.WeightsSource
  client_ids: Optional[Sequence[str]] = None


def _better(a: per_client.ClientMetrics, b: per_client.ClientMetrics) -> bool:
  """Whether `a` beats `b` on validation (loss, then accuracy)."""
  return (-a.loss, a.accuracy) > (-b.loss, b.accuracy)


def choose(context: run_context_lib.RunContext,
           candidates: Sequence[Candidate]) -> dict[str, str]:
  """Each client's candidate by the rule of the module docstring.

  Writes `CHOICE_FILE` in the run's output directory and logs how many
  clients fall back to the first candidate.

  Returns:
    Client id -> the name of the candidate it uses.
  """
  data = context.experiment.data
  validating = [cid for cid in context.client_ids
                if data.num_examples(cid, 'validation')]
  covers = {c.name: set(context.client_ids if c.client_ids is None
                        else c.client_ids) for c in candidates}
  scores: dict[str, Mapping[str, per_client.ClientMetrics]] = {}
  for candidate in candidates:
    ids = [cid for cid in validating if cid in covers[candidate.name]]
    scores[candidate.name] = context.evaluate(
        candidate.weights, split='validation', client_ids=ids)
  chosen = {}
  for cid in context.client_ids:
    mine = [c.name for c in candidates if cid in covers[c.name]]
    if cid not in validating:
      chosen[cid] = mine[-1]
      continue
    best = mine[0]
    for name in mine[1:]:
      if _better(scores[name][cid], scores[best][cid]):
        best = name
    chosen[cid] = best
  _write(context.config.output_dir, candidates, scores, chosen)
  fallback = candidates[0].name
  falling = sorted(cid for cid, name in chosen.items() if name == fallback)
  logging.info(
      '%d of %d clients use the %s model: it scores at least as well on'
      ' their validation splits as their personalized models%s.',
      len(falling), len(chosen), fallback,
      f' ({len(context.client_ids) - len(validating)} without validation'
      ' examples use their own)' if len(validating) < len(chosen) else '')
  return chosen


def lookup(candidates: Sequence[Candidate], chosen: Mapping[str, str]):
  """`WeightsSource` of each client's chosen model."""
  by_name = {c.name: c.weights for c in candidates}

  def weights_for(client_id: str):
    return per_client.weights_for_client(by_name[chosen[client_id]],
                                         client_id)

  return weights_for


def validated_metrics(context: run_context_lib.RunContext,
                      candidates: Sequence[Candidate]):
  """The final kind 'validated' (`RunContext.final_metrics`'s form)."""
  chosen = choose(context, candidates)
  return context.final_metrics(KIND, lookup(candidates, chosen))


def _write(output_dir: str, candidates: Sequence[Candidate],
           scores: Mapping[str, Mapping[str, per_client.ClientMetrics]],
           chosen: Mapping[str, str]) -> None:
  names = [c.name for c in candidates]
  fields = ['client', 'uses', *(f'{n}_validation_accuracy' for n in names),
            *(f'{n}_validation_loss' for n in names)]

  def write(f):
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    for cid, name in chosen.items():
      row = {'client': cid, 'uses': name}
      for n in names:
        if cid in scores[n]:
          row[f'{n}_validation_accuracy'] = scores[n][cid].accuracy
          row[f'{n}_validation_loss'] = scores[n][cid].loss
      writer.writerow(row)

  files.write_atomically(os.path.join(output_dir, CHOICE_FILE), write)
