"""FedMD (Li & Wang 2019): each client's own model, aligned through logits.

Clients of different architectures (`--client_models`, e.g.
`lenet:0.5,ditto_cnn:0.5`, assigned as FedDF's, or one per client from
`--client_models_file`: `client_architectures`)
each keep a model of their own across rounds. A round of the sampled
clients (`tff_fair.algorithms.fedmd`): each computes its logits on the
round's alignment set (`--fedmd_alignment_examples` of the public set,
`--public_examples`, a fresh seeded subset each round; 0: all of it), the
server averages them into the consensus, each client fits it (mean absolute
error, Adam at `--fedmd_digest_learning_rate`, `--fedmd_digest_epochs`
passes in batches of `--fedmd_digest_batch_size`), then trains on its
private data (`--local_epochs` with the client optimizer, as FedAvg's
local training). The public set's labels are never read.

There is no global model. Each client's model lives in the run's
`fedmd_models/<architecture>/` store, versioned with the checkpoints, so a
resumed run continues with the models of the checkpoint's round. A client
not yet sampled has its architecture's initial model (seeded by `--seed`;
the server state holds them, with the round count that seeds the
alignment subsets). `--model` must be one of the architectures: its
initial model is what the driver calls the global model.

Evaluation: each client's own model on its test split (per round
`test_*`, over the clients that have trained one; after the last round
'personalized'; with clients never sampled also 'personalized_or_initial',
every client with the model it has). Released each round: `consensus_size`
(clients averaged), `consensus_examples`, per architecture A `A_clients`
and `A_digest_loss` (the MAE to the consensus over the digest's batches),
`train_*` (the private training's metrics over every architecture).
`fedmd_rounds.csv` has one row per round and sampled client: its
architecture and digest loss.

The paper's transfer learning is `--fedmd_pretrain_epochs` (default 20):
each architecture's initial model trained on the public set with its
labels before round 1 (the private training that follows it in the paper
is round 1's revisit). With 0 the public labels are never read, but
FedMD then fell below training alone on digits: the consensus of barely
trained models holds every model back (docs/algorithms/fedmd.md).
"""

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fair import attacks
from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import fedmd as fedmd_lib
from tff_fair.models import names as model_names
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import client_architectures
from tff_fair.training.recipes import recipe

MODELS_DIR = 'fedmd_models'
ROUND_LOG = 'fedmd_rounds.csv'
ROUND_LOG_FIELDS = ('round', 'client', 'architecture', 'digest_loss')
_NO_SERVER_MODEL = ('FedMD has no server model: clients send logits, whose'
                    ' mean is all the server computes')


# Epochs of transfer learning on the labeled public set by default: the
# recipe test's setting, where FedMD then beats training alone (without it,
# it did not).
PRETRAIN_EPOCHS = 20

@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes (see the module docstring):

    client_models: 'architecture:share,...'; '' gives every client --model.
    client_models_file: JSON {client_id: architecture}, instead.
    fedmd_alignment_examples: Public examples per round (>= 0; 0: all).
    fedmd_digest_epochs: Passes over the alignment set (>= 1).
    fedmd_digest_batch_size: Alignment examples per digest step (>= 1).
    fedmd_digest_learning_rate: Adam's learning rate in the digest (> 0).
    fedmd_pretrain_epochs: Epochs on the labeled public set before round 1
      (>= 0; 0: none).
  """

  client_models: str = client_architectures.client_models_setting()
  client_models_file: str = client_architectures.client_models_file_setting()
  fedmd_alignment_examples: int = config_lib.setting(
      0, "public examples each round's consensus is computed and digested"
      ' on, a fresh seeded subset each round (the paper: 5000); 0: the'
      ' whole public set.')
  fedmd_digest_epochs: int = config_lib.setting(
      1, "passes over the round's alignment set when a client fits the"
      " consensus (the paper's 1).")
  fedmd_digest_batch_size: int = config_lib.setting(
      64, 'alignment examples per step of the digest.')
  fedmd_digest_learning_rate: float = config_lib.setting(
      1e-3, "Adam's learning rate when a client fits the consensus (the"
      " paper's 1e-3).")
  fedmd_pretrain_epochs: int = config_lib.setting(
      PRETRAIN_EPOCHS, "the paper's transfer learning: epochs of each"
      " architecture's"
      ' initial model on the public set with its labels (client optimizer,'
      ' --batch_size) before round 1; 0: none, the public labels are never'
      ' read.')

  def __post_init__(self):
    client_architectures.check_settings(self)
    for name, minimum in (('fedmd_alignment_examples', 0),
                          ('fedmd_digest_epochs', 1),
                          ('fedmd_digest_batch_size', 1),
                          ('fedmd_pretrain_epochs', 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or (
          value < minimum):
        raise config_lib.ConfigError(
            f'--{name} must be an int >= {minimum}, got {value!r}.')
    config_lib.check_learning_rate('--fedmd_digest_learning_rate',
                                   self.fedmd_digest_learning_rate)


class _Process:
  """`fedmd.FedMDProcess` as the driver handles a process: its "global
  model" is `--model`'s start model. Every architecture starts from its
  seeded initial weights, pretrained (`FedMDProcess.pretrain`): the driver
  sets `--model`'s seeded weights after `initialize`, which are pretrained
  the same way (once: the result is kept)."""

  def __init__(self, process: fedmd_lib.FedMDProcess, main: str,
               initial_weights):
    self.fedmd = process
    self._main = main
    self._initial_weights = initial_weights
    self._starts = None

  def _pretrained(self, weights):
    if self._starts is None:
      self._starts = self.fedmd.pretrain(self._initial_weights)
    return collections.OrderedDict(
        (name, self._starts[name] if _same(w, self._initial_weights[name])
         else self.fedmd.pretrain({name: w})[name])
        for name, w in weights.items())

  def initialize(self):
    # `FedMDProcess.initialize`'s state, from the seeded initial weights.
    return collections.OrderedDict(
        round=np.int64(0), models=self._pretrained(self._initial_weights))

  def get_model_weights(self, state):
    return self.fedmd.get_model_weights(state)[self._main]

  def set_model_weights(self, state, weights):
    return self.fedmd.set_model_weights(
        state, self._pretrained({self._main: weights}))


def _same(weights, other) -> bool:
  """Whether two `ModelWeights` hold the same bytes."""
  flat, other_flat = (tf.nest.flatten(w) for w in (weights, other))
  return len(flat) == len(other_flat) and all(
      np.asarray(a).tobytes() == np.asarray(b).tobytes()
      for a, b in zip(flat, other_flat))


class FedMD(client_architectures.SeveralArchitectures, recipe.Recipe):
  """FedMD: clients' own models of several architectures, aligned on the
  consensus of their logits on a public set."""

  name = 'fedmd'
  Settings = Settings
  # Clients start from their own models, not from a broadcast one: the
  # driver's client context (attack specs on updates) has nothing to act on.
  client_context = False
  reads = {
      **{name: config_lib.READS_ALL[name] for name in (
          'clients_per_round', 'local_epochs', 'batch_size',
          'client_optimizer', 'client_learning_rate', 'eval_every')},
      'attack': (attacks.NONE, attacks.LABEL_POISONING),
      'public_examples': None,
  }
  ignored_because = {
      'server_optimizer': _NO_SERVER_MODEL,
      'server_learning_rate': _NO_SERVER_MODEL,
      'aggregator': 'FedMD clients send logits, not model updates, and the'
                    ' consensus is their plain mean',
      'attack': 'FedMD clients send no model updates to attack (a data'
                ' attack, --attack=label_poisoning, applies)',
  }
  runs_on_several_workers = False
  output_files = (ROUND_LOG,)
  # One store per architecture (their models' shapes differ).
  client_state_dirs = tuple(f'{MODELS_DIR}/{name}'
                            for name in model_names.PLAIN_MODELS)
  progress_fields = (('consensus_size', 'consensus_clients'),)
  required_settings = {'public_examples': 200}

  @classmethod
  def check_config(cls, config):
    if not config.public_examples:
      raise config_lib.ConfigError(
          '--algorithm=fedmd aligns its clients on a public set of examples'
          ' no client holds: set --public_examples=N (e.g. 200).')
    alignment = config.settings.fedmd_alignment_examples
    if alignment > config.public_examples:
      raise config_lib.ConfigError(
          f'--fedmd_alignment_examples={alignment} is more than the'
          f' --public_examples={config.public_examples}: lower it, or 0 for'
          ' the whole public set.')
    client_architectures.check_client_models(config)
    return config

  def __init__(self, context):
    super().__init__(context)
    config = self.config
    specs = context.experiment.model_specs
    self._initial_weights = {name: specs[name].initial_weights(config.seed)
                             for name in self.architectures}
    self.own_models = {
        name: context.client_model_store(f'{MODELS_DIR}/{name}',
                                         self._initial_weights[name])
        for name in self.architectures}
    self._log = context.round_log(ROUND_LOG, ROUND_LOG_FIELDS)
    self._fedmd = None

  def build_process(self):
    settings = self.settings
    specs = self.context.experiment.model_specs
    public_x, public_y = self.context.public_arrays()
    self._fedmd = fedmd_lib.build_fedmd(
        {name: specs[name].model_fn for name in self.architectures},
        self.client_optimizer(),
        public_x=public_x,
        alignment_examples=settings.fedmd_alignment_examples,
        digest_optimizer=tff.learning.optimizers.build_adam(
            learning_rate=settings.fedmd_digest_learning_rate),
        digest_epochs=settings.fedmd_digest_epochs,
        digest_batch_size=settings.fedmd_digest_batch_size,
        seed=self.config.seed,
        public_y=public_y,
        pretrain_epochs=settings.fedmd_pretrain_epochs,
        pretrain_batch_size=self.config.batch_size)
    return _Process(self._fedmd,
                    client_architectures.main_model(self.config),
                    self._initial_weights)

  def _model_of(self, state):
    """Client id -> its own model (its architecture's start if none)."""
    starts = self._fedmd.get_model_weights(state)

    def model(cid):
      name = self.client_architectures[cid]
      own = self.own_models[name].weights(cid)
      return starts[name] if own is None else own

    return model

  def run_round(self, plan, process, state, client_inputs):
    model = self._model_of(state)
    by_architecture = collections.OrderedDict(
        (name, []) for name in self.architectures)
    ids = collections.OrderedDict((name, []) for name in self.architectures)
    for cid, dataset in zip(plan.client_ids, client_inputs):
      name = self.client_architectures[cid]
      by_architecture[name].append(fedmd_lib.client_input(dataset,
                                                          model(cid)))
      ids[name].append(cid)
    output = process.fedmd.next_with_client_outputs(state, by_architecture)
    clients = {cid: value for name, values in output.clients.items()
               for cid, value in zip(ids[name], values)}
    return client_outputs.RoundOutput(output.state, output.metrics, clients)

  def after_round(self, plan, output):
    """Keeps each sampled client's new model; logs its digest."""
    rows = []
    for cid in plan.client_ids:
      value, name = output.clients[cid], self.client_architectures[cid]
      self.own_models[name].write(cid, value['model'], plan.number)
      rows.append({'round': plan.number, 'client': cid, 'architecture': name,
                   'digest_loss': round(float(value['digest_loss']), 6)})
    self._log.append(rows)
    return {}

  def _trained(self) -> set[str]:
    return {cid for store in self.own_models.values()
            for cid in store.trained_client_ids()}

  def evaluation_models(self, state, global_weights, client_ids):
    """Each client's own model, for the clients that trained one
    (`test_*`), and how many have none yet (`personal_clients_untrained`).
    """
    del global_weights  # There is none: it is one architecture's start.
    trained = self._trained()
    personalized = [cid for cid in client_ids if cid in trained]
    models = ({'': (self._model_of(state), personalized,
                    self.client_architectures)} if personalized else {})
    return models, {'personal_clients_untrained': float(
        len(client_ids) - len(personalized))}

  def final_evaluations(self, state, global_weights):
    """'personalized': the clients with a model of their own; with clients
    never sampled also 'personalized_or_initial' (every client, those with
    their architecture's initial model)."""
    del global_weights  # There is none.
    ids = self.context.client_ids
    trained = self._trained()
    model = self._model_of(state)
    evaluations = self.context.final_metrics(
        'personalized', model, client_ids=[c for c in ids if c in trained],
        variant=self.client_architectures)
    if len(trained) < len(ids):
      evaluations.update(self.context.final_metrics(
          'personalized_or_initial', model,
          variant=self.client_architectures))
    return evaluations

