"""pFedMe (Dinh et al. 2020): personalized models by Moreau envelopes.

Each sampled client trains a personalized model theta (K inner steps per
batch on its loss plus lambda/2 ||theta - w_loc||^2) and a local model
w_loc that descends the envelope (`tff_fair.algorithms.pfedme`); the
server mixes the local models into the global one. Both theta and w_loc
start from the global model each round, so a client's personalized model
is the one of the last round it took part in (by default the mean of its
thetas over that round: `personal_iterate`), kept in the run's `personal/`
store, versioned with the checkpoints.

How the shared settings map to the paper's:

* eta, the local model's rate: `--client_learning_rate`, by plain SGD
  (`--client_optimizer=sgd`, the paper's rule; other client optimizers are
  refused). `client_learning_rate * pfedme_lambda` must be < 2, else the
  client's round diverges (`check_config` refuses it).
* beta, the server's mixing w <- (1 - beta) w + beta mean(w_loc):
  `--server_learning_rate` with `--server_optimizer=sgd` (the default; the
  paper's beta = 1, or 2). Other server optimizers apply to the mean
  update w - w_loc as FedOpt does to FedAvg's (e.g. FedAdam): a server
  step that never reaches the clients' rounds, so it cannot upset their
  stability.
* R, the local rounds: every batch of the round's data is one (each a
  batch's K inner steps, then one local-model step), so
  R = local_epochs * ceil(n_k / batch_size); the reference draws 20
  batches.

Defaults. The data sets' client rates range from 0.05 to 1, so lambda
and p_lr follow eta when left at 0 (`default_lambda`,
`default_personal_learning_rate`): lambda = min(15, 0.75 / eta), the
paper's 15 at the image data sets' 0.05, and p_lr = 1 / (lambda + 2 /
eta). Measured with them (4 homogeneous clients, 5 rounds, small subsets:
the global model's test accuracy, pFedMe vs FedAvg): digits 0.61 vs 0.53,
fashion_mnist 0.69 vs 0.57, mnist 0.81 vs 0.61, femnist 0.30 vs 0.27,
cifar10 0.17 vs 0.21, sst2 0.57 vs 0.57, shakespeare (2 rounds) 0.20 vs
0.09, at about 5 times FedAvg's local computation. With the paper's p_lr
0.09 (lambda 15) that fashion_mnist run's personalized models scored 0.31
(the global 0.53), and a LeNet trained by the inner steps alone stayed at
13% training accuracy after 5 epochs (60-64% at p_lr 0.01-0.03).

The train metrics (`train_*`) are of the inner steps, each batch counted K
times (`train_num_examples` too).

Outputs of its own: `personal/` (each client's personalized model) and
`pfedme_rounds.csv` (per round and sampled client: the mean loss of its
inner steps, and the loss and accuracy of the personalized model it ends
the round with on its training data, so a model that collapses shows for
that client). Per round it releases `personal_*` statistics of those; its
evaluation measures the personalized models (`test_*`, 'personalized')
and the global one (`global_test_*`, 'global'), and after the last round
'validated': each client's choice of the two on its validation split
(`personalization`).
"""

import dataclasses

from tff_fair.algorithms import client_outputs
from tff_fair.algorithms import pfedme as pfedme_lib
from tff_fair.training import config as config_lib
from tff_fair.training import personalization
from tff_fair.training.recipes import own_models

PERSONAL_DIR = own_models.PERSONAL_DIR
ROUND_LOG = 'pfedme_rounds.csv'
ROUND_LOG_FIELDS = ('round', 'client', 'malicious', 'train_loss_during',
                    'train_loss', 'train_accuracy')
# The defaults of lambda and p_lr follow the client learning rate eta (as
# the data set's default rate varies from 0.05 to 1). Lambda: the paper's 15
# where eta allows, at most LOCAL_STEP / eta, so that the local model's
# step eta * lambda stays at most 0.75 (the paper's 15 at the image data
# sets' 0.05; 2 diverges).
LOCAL_STEP = 0.75
_FLAGS = {'lam': '--pfedme_lambda', 'inner_steps': '--pfedme_inner_steps',
          'personal_learning_rate': '--pfedme_personal_learning_rate'}


def default_lambda(client_learning_rate: float) -> float:
  """What `pfedme_lambda=0` means: min(15, LOCAL_STEP / eta)."""
  return min(pfedme_lib.LAMBDA, LOCAL_STEP / client_learning_rate)


def default_personal_learning_rate(lam: float,
                                   client_learning_rate: float) -> float:
  """What `pfedme_personal_learning_rate=0` means: 1 / (lambda + 2 / eta).

  An inner step descends f + (lambda/2) ||theta - w_loc||^2, whose
  curvature is the loss's plus lambda; SGD at the client rate eta trains
  the loss up to a curvature of 2 / eta (sharper directions diverge, so
  training stays below it). Half the largest stable step for that
  curvature. With the paper's 0.09 (at lambda 15 stable only for a loss
  curvature below 7.2) a LeNet trained by the inner steps on a
  Fashion-MNIST client stayed near chance, 13% after 5 epochs; at
  0.01-0.03 it reached 60-64%.
  """
  return 1.0 / (lam + 2.0 / client_learning_rate)


@dataclasses.dataclass(frozen=True)
class Settings:
  """Attributes:

    pfedme_lambda: lambda, > 0; 0 (default) resolves from the client
      learning rate eta to min(15, 0.75 / eta) (`default_lambda`): the
      paper's 15 on fashion_mnist, mnist and cifar10 (eta 0.05), 7.5 on
      digits and femnist (0.1), 3 on sst2 (0.25), 0.75 on shakespeare
      (1.0).
    pfedme_inner_steps: K, inner steps on each batch, >= 1.
    pfedme_personal_learning_rate: p_lr, the inner steps' SGD rate, with
      p_lr * lambda < 2; 0 (default) resolves to 1 / (lambda + 2 / eta)
      (`default_personal_learning_rate`): 0.018 on fashion_mnist, mnist
      and cifar10, 0.036 on digits and femnist, 0.091 on sst2, 0.36 on
      shakespeare. (The paper's 0.09 was tuned on MNIST with a linear
      model.)
    personal_iterate: The personalized model a round keeps: 'average' (the
      mean of theta after each batch, weighted by examples) or 'last'
      (theta after the last batch, the reference's, which a short last
      batch can collapse onto its classes).
  """

  pfedme_lambda: float = config_lib.setting(
      0.0, 'lambda, how closely each personalized model stays to the'
      " local one (0: the paper's 15, or 0.75 / client_learning_rate"
      " where that is smaller). pFedMe's other knobs are shared flags:"
      ' eta is --client_learning_rate (plain SGD), beta (w <- (1 - beta) w'
      ' + beta mean(w_loc)) is --server_learning_rate with'
      ' --server_optimizer=sgd, and every batch of the --local_epochs'
      " passes is one of the paper's local rounds.")
  pfedme_inner_steps: int = config_lib.setting(
      pfedme_lib.INNER_STEPS, 'K, inner steps of the personalized model'
      ' on each batch.')
  pfedme_personal_learning_rate: float = config_lib.setting(
      0.0, 'learning rate of the inner steps of the personalized model;'
      ' p_lr * lambda must be < 2 (0: 1 / (lambda + 2 /'
      ' client_learning_rate), half the largest stable step when the loss'
      ' is as sharp as SGD at client_learning_rate lets it become; the'
      " paper's 0.09 kept a LeNet near chance on Fashion-MNIST).")
  personal_iterate: str = own_models.personal_iterate_setting()

  def __post_init__(self):
    config_lib.check_choice('personal_iterate', self.personal_iterate,
                            own_models.PERSONAL_ITERATES)
    # A value of 0 is resolved by `check_config`, which checks it then.
    _check(self)


def _check(settings: Settings) -> None:
  """`pfedme.check_arguments` of the settings (0: unresolved), naming flags."""
  try:
    pfedme_lib.check_arguments(
        settings.pfedme_lambda or None, settings.pfedme_inner_steps,
        settings.pfedme_personal_learning_rate or None, names=_FLAGS)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from e


class PFedMe(own_models.OwnModels):
  """pFedMe's global model and each client's personalized model theta."""

  name = 'pfedme'
  Settings = Settings
  reads = {**config_lib.READS_ALL, 'client_optimizer': ('sgd',)}
  ignored_because = {
      'client_optimizer': "pFedMe's local model takes plain SGD steps on"
                          ' the envelope gradient, w_loc <- w_loc - eta'
                          " lambda (w_loc - theta) (the paper's rule, whose"
                          ' stability bound eta * lambda < 2 the run checks;'
                          ' with momentum 0.9 a round can diverge at'
                          " eta * lambda = 0.3 already, at the paper's p_lr"
                          ' and K; Adam changes what eta means)',
  }
  # Each round returns every client's theta.
  runs_on_several_workers = False
  output_files = (ROUND_LOG, personalization.CHOICE_FILE)
  client_state_dirs = (PERSONAL_DIR,)
  models_dir = PERSONAL_DIR
  progress_fields = own_models.PERSONAL_TRAIN_PROGRESS

  @classmethod
  def check_config(cls, config):
    """Resolves lambda and p_lr left at 0; refuses unstable rates."""
    settings = config.settings
    eta = config.client_learning_rate
    lam = settings.pfedme_lambda or default_lambda(eta)
    settings = dataclasses.replace(
        settings, pfedme_lambda=lam,
        pfedme_personal_learning_rate=(
            settings.pfedme_personal_learning_rate
            or default_personal_learning_rate(lam, eta)))  # Checked.
    if eta * lam >= pfedme_lib.STABLE_RATE_TIMES_LAMBDA:
      raise config_lib.ConfigError(
          f'--client_learning_rate={eta} with --pfedme_lambda={lam}: the'
          f" local model's step eta * lambda = {eta * lam:g} must be < 2"
          ' (w_loc <- w_loc - eta lambda (w_loc - theta) diverges'
          ' otherwise). Lower --client_learning_rate below'
          f' {pfedme_lib.STABLE_RATE_TIMES_LAMBDA / lam:.3g} or'
          f' --pfedme_lambda below'
          f' {pfedme_lib.STABLE_RATE_TIMES_LAMBDA / eta:.3g} (or leave it'
          ' unset: it then follows the client learning rate).')
    return dataclasses.replace(config, settings=settings)

  def __init__(self, context):
    super().__init__(context)
    self._log = context.round_log(ROUND_LOG, ROUND_LOG_FIELDS)

  def build_process(self):
    settings = self.settings
    return pfedme_lib.build_pfedme(
        self.model_fn, self.client_optimizer(), self.server_optimizer(),
        lam=settings.pfedme_lambda, inner_steps=settings.pfedme_inner_steps,
        personal_learning_rate=settings.pfedme_personal_learning_rate,
        average_personal_iterates=settings.personal_iterate == 'average',
        model_aggregator=self.model_aggregator(), client_context=True)

  def run_round(self, plan, process, state, client_inputs):
    del plan  # theta starts from the global model: nothing per client.
    return process.next_with_client_outputs(state, client_inputs)

  def after_round(self, plan, output):
    """Keeps each client's theta; logs and releases how it trains.

    Of the theta each client ends the round with, on its training data
    (poisoned labels included), so a collapsed personalized model shows;
    statistics over the benign clients.
    """
    context = self.context
    round_num, client_ids = plan.number, plan.client_ids
    clients = list(output.clients)
    personal = {cid: client_outputs.as_model_weights(c['personal'])
                for cid, c in zip(client_ids, clients)}
    for cid, weights in personal.items():
      self.own_models.write(cid, weights, round_num)
    on_train = context.evaluator.evaluate_clients(
        personal, client_ids, context.training_arrays)
    records = [{
        'round': round_num, 'client': cid,
        'malicious': int(cid in context.malicious),
        'train_loss_during': float(c['loss']),
        'train_loss': on_train[cid].loss,
        'train_accuracy': on_train[cid].accuracy,
    } for cid, c in zip(client_ids, clients)]
    self._log.append(records)
    benign = [r for r in records if not r['malicious']]
    if not benign:  # Only attackers sampled: nothing to report this round.
      return {}
    return own_models.personal_train_statistics(benign)

  def final_evaluations(self, state, global_weights):
    evaluations = super().final_evaluations(state, global_weights)
    evaluations.update(self.validated_metrics(global_weights))
    return evaluations
