"""One validated configuration per run, saved beside its checkpoints.

The configuration is checked once, at the boundary, and written to
`<output_dir>/config.json`. A later run in the same output directory must
agree on every setting that changes what the checkpoints mean; it may differ
in the settings listed in `RESUMABLE_FIELDS` (e.g. more rounds, to extend a
finished run) and in its algorithm's settings marked resumable.

An algorithm's own settings are not here: each recipe
(`tff_fair.training.recipes`) declares them as a frozen dataclass of
`setting` fields, carried in `RunConfig.settings` and flattened beside the
shared ones in config.json and the flags.
"""

from collections.abc import Mapping, Sequence
import dataclasses
import json
import math
import os
from typing import Any, Optional

from tff_fair import attacks
from tff_fair import errors
from tff_fair import files
from tff_fair.models import names as model_names
from tff_fair.privacy import accounting

PARTITIONS = ('homogeneous', 'dirichlet', 'quantity_skew', 'label_skew',
              'natural')
OPTIMIZERS = ('sgd', 'sgdm', 'adam', 'adamw')
AGGREGATORS = ('mean', 'robust', 'dp', 'compression')
# The rules of tff_fair.data.partition (kept here: config imports no TF;
# config_test checks they agree).
LABEL_SKEW_RULES = ('niid_bench', 'cyclic')
QUANTITY_LARGE_CLIENTS = ('random', 'first')
KAPPA_SCOPES = ('shared', 'each')
# The names of tff_fair.data.SOURCE_NAMES (kept here: config imports no TF).
DATASETS = ('fashion_mnist', 'mnist', 'cifar10', 'femnist', 'shakespeare',
            'sst2', 'digits')
# Layer initializers are seeded with seed * 1000 + layer (an int64): larger
# seeds cannot be converted.
MAX_SEED = (2**63 - 1) // 1000 - 1


@dataclasses.dataclass(frozen=True)
class DatasetDefaults:
  """What a run on one data set gets for the settings left unset.

  Chosen so a few rounds on a small subset clearly beat chance
  (tests/training/defaults_learn_test.py) and by the literature's settings:
  TFF's and LEAF's character LSTM trains by SGD at a learning rate near 1
  on small batches; a 62-class FEMNIST LeNet and the 8x8 digits learn too
  slowly at 0.05. SST-2's text CNN at 0.25 is within a point of 1.0 after
  that test's 5 rounds (0.569 against 0.576) and its loss stayed finite
  over 60 rounds in every case of benchmarks/aequa_table.py, where 1.0
  (homogeneous) and 0.5 (quantity skew) diverged.
  """

  model: str
  client_learning_rate: float
  batch_size: int


DATASET_DEFAULTS = {
    'fashion_mnist': DatasetDefaults('lenet', 0.05, 32),
    'mnist': DatasetDefaults('lenet', 0.05, 32),
    'digits': DatasetDefaults('lenet', 0.1, 32),
    'femnist': DatasetDefaults('lenet', 0.1, 32),
    'cifar10': DatasetDefaults('cifar_cnn', 0.05, 32),
    'sst2': DatasetDefaults('text_cnn', 0.25, 32),
    'shakespeare': DatasetDefaults('char_lstm', 1.0, 4),
}


def dataset_defaults_help(field: str) -> str:
  """'fashion_mnist 0.05, mnist 0.05, ...': one `DatasetDefaults` field."""
  return ', '.join(f'{name} {getattr(defaults, field)}'
                   for name, defaults in DATASET_DEFAULTS.items())


# Settings that may change between a run and its resumption (an algorithm's
# own are marked `resumable` in its settings: see `setting`).
RESUMABLE_FIELDS = frozenset({
    'rounds', 'output_dir', 'data_dir', 'eval_every',
    'max_concurrent_computation_calls', 'server_held_out_examples',
    'common_test_evaluation',
})

# Every shared setting read only when another setting has one of some
# values: {setting: (other setting, its values that read it)}. Given a value
# other than its default where nothing reads it, a setting would be
# silently ignored, so `RunConfig` refuses it (after every value check, so a
# bad value is named as such first); resuming does not compare it. (An
# algorithm's own settings are refused with any other algorithm by
# `recipes.registry.make_config`.)
SETTING_READERS = {
    **dict.fromkeys(('dp_noise_multiplier', 'dp_delta', 'dp_target_epsilon'),
                    ('aggregator', ('dp',))),
    'attack_scale': ('attack', ('model_replacement',)),
    'alpha': ('partition', ('dirichlet',)),
    'dirichlet_top_up': ('partition', ('dirichlet',)),
    **dict.fromkeys(
        ('kappa', 'quantity_clients', 'quantity_large_clients', 'kappa_scope'),
        ('partition', ('quantity_skew',))),
    **dict.fromkeys(('classes_per_client', 'label_skew_rule'),
                    ('partition', ('label_skew',))),
}

# Shared settings that some algorithms act on and others ignore. Each recipe
# declares which of them it reads, and which of their values
# (`Recipe.reads`); a run refuses one given a value other than its default to
# an algorithm that does not read it (`unread_settings`), and a resume
# compares only what the algorithm reads. Every algorithm reads the other
# shared settings (data, partition, model, seed, rounds, output, runtime).
ALGORITHM_DEPENDENT = (
    'clients_per_round', 'local_epochs', 'batch_size', 'client_optimizer',
    'client_learning_rate', 'server_optimizer', 'server_learning_rate',
    'aggregator', 'attack', 'eval_every', 'server_held_out_examples',
    'public_examples')
# What a recipe declares: setting -> the values it acts on (None: every
# value). A setting left out is one it ignores.
Reads = Mapping[str, Optional[tuple[Any, ...]]]
# Every value of every algorithm-dependent setting but the server's held-out
# and public sets (FedAvg's reads: `Recipe.reads`).
READS_ALL: Reads = {name: None for name in ALGORITHM_DEPENDENT
                    if name not in ('server_held_out_examples',
                                    'public_examples')}

CONFIG_FILE = 'config.json'

# Settings whose default changed after runs were saved without them: a
# missing value means what those runs used, not today's default, but only
# where it acts: {setting: ((setting it acts under, its value), old value)}.
LEGACY_VALUES = {
    'label_skew_rule': (('partition', 'label_skew'), 'cyclic'),
    'quantity_large_clients': (('partition', 'quantity_skew'), 'first'),
    'per_fedavg_hessian_product': (('per_fedavg_variant', 'hf'),
                                   'finite_difference'),
}


class ConfigError(errors.UserError, ValueError):
  """A setting is invalid, or disagrees with the run being resumed."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything that defines a training run.

  The settings every algorithm shares; an algorithm's own are in
  `settings` (its recipe's `Settings`). Build a complete one with
  `tff_fair.training.recipes.registry.make_config`, which also checks the
  algorithm's settings against these. A setting read only under some value
  of another (`SETTING_READERS`: an aggregator's, an attack's, a
  partition's) must keep its default otherwise: it would be ignored.

  Attributes:
    algorithm: A name of `tff_fair.training.recipes.registry.RECIPES`.
    dataset: A `tff_fair.data` source name, e.g. 'fashion_mnist'.
    partition: One of `PARTITIONS`.
    num_clients: Number of clients the data is split into.
    clients_per_round: Clients sampled uniformly each round (<= num_clients).
    rounds: Federated rounds.
    local_epochs: Client epochs per round.
    batch_size: Client batch size (0: the data set's, `DATASET_DEFAULTS`).
    client_optimizer / server_optimizer: One of `OPTIMIZERS`.
    client_learning_rate / server_learning_rate: Their learning rates (a
      client rate of 0: the data set's, `DATASET_DEFAULTS`).
    seed: Seeds partition, initial model, client sampling and shuffling.
    output_dir: Checkpoints, releases and the final tables go here.
    model: Architecture name; '' picks the data set's default.
    alpha: Dirichlet concentration (partition 'dirichlet').
    dirichlet_top_up: One Dirichlet draw whose small clients are topped up
      from the largest ones, instead of NIID-Bench's redraws; needed when
      clients are many for the data (e.g. 10,000 Fashion-MNIST clients).
    kappa, quantity_clients: Share of data and number of clients that get it
      (partition 'quantity_skew').
    classes_per_client: m of #C=m (partition 'label_skew').
    label_skew_rule: How 'label_skew' assigns classes: 'niid_bench' (client
      i holds class i mod K and m - 1 others drawn at random, seeded: the
      rule of NIID-Bench, IAFL and Aequa) or 'cyclic' (consecutive classes
      around one random cycle; tff_fair's rule before this setting, and
      what a saved run without it used).
    quantity_large_clients: Which clients 'quantity_skew' makes large:
      'random' (quantity_clients drawn at random, seeded) or 'first'
      (clients 0..m-1; tff_fair's rule before this setting, and what a
      saved run without it used).
    kappa_scope: 'shared': kappa is the large clients' share together
      (IAFL's reading); 'each': each large client holds kappa of the data
      (the Aequa paper's wording; needs quantity_clients * kappa < 1).
    examples_per_client: Cap on each client's pool before its own
      train/validation/test split; 0 means no cap.
    source_examples: Use a deterministic stratified subset of this many
      examples of the data set before partitioning (0: all of it); unlike
      a per-client cap it keeps a quantity skew's proportions.
    validation_fraction / test_fraction: Each client's own split.
    server_held_out_examples: Size of each of two server-side held-out sets
      (validation, test) drawn from examples no client holds (0: none).
      An algorithm that measures the global model on common held-out data
      (Aequa's rewards) uses the server's validation and test sets instead
      of the clients' pooled splits. Clients' data is the same
      either way, so this may change when a run is resumed.
    public_examples: Size of a public set of examples no client holds (nor
      the server's held-out sets), for the algorithms that share one
      (distillation: their recipes read it); 0: none.
    rotated_client_fraction: Share of the clients (a seeded choice) whose
      images are rotated 180 degrees in all their splits: a concept shift
      for clustered FL; 0: none. Image data sets only.
    eval_every: Evaluate every client's test split every this many rounds
      (0: only after the last round).
    common_test_evaluation: After the last round, also measure every
      client's final model(s) on the common test set (the server's held-out
      test set, else all clients' test splits pooled), as the fairness
      literature (CGSV, IAFL, Aequa) compares a client's reward with its
      standalone accuracy; reported as model kinds `<kind>:common_test`.
      One pass over that set per client and kind, so off by default.
    data_dir: Data directory (see `tff_fair.data.sources`); '' uses
      $TFF_FAIR_DATA_DIR.
    max_concurrent_computation_calls: Worker concurrency (-1: unlimited).
    aggregator: How client updates of the global model are aggregated:
      'mean' (weighted), 'robust' (tff.learning.robust_aggregator), 'dp'
      (tff.learning.dp_aggregator, unweighted, with dp_noise_multiplier),
      'compression' (tff.learning.compression_aggregator).
    dp_noise_multiplier: Noise multiplier of the 'dp' aggregator, in [0,
      0.1 * clients_per_round) (`privacy.accounting.check`); resolved from
      dp_target_epsilon when that is given.
    dp_delta: The delta of the run's (epsilon, delta) guarantee, in (0,
      1/num_clients); 0 resolves to 1/num_clients^1.1.
    dp_target_epsilon: A privacy budget: the run takes the smallest noise
      multiplier whose epsilon after `rounds` is at most this
      (`privacy.accounting.noise_for_epsilon`; config.json records it);
      0: none (dp_noise_multiplier is used).
    attack: One of `tff_fair.attacks.ATTACKS`.
    malicious_fraction: Fraction of clients that attack.
    label_noise_file: JSON {client_id: fraction} of each named client's
      training labels replaced by random classes (1: a free rider); for
      studies of contributions and rewards. '' (default): none.
    attack_scale: Update multiplier of 'model_replacement'.
    settings: The algorithm's own settings: an instance of its recipe's
      `Settings` (`NoSettings` for an algorithm without any).
  """

  algorithm: str = ''
  dataset: str = 'fashion_mnist'
  partition: str = 'dirichlet'
  num_clients: int = 10
  clients_per_round: int = 10
  rounds: int = 5
  local_epochs: int = 1
  batch_size: int = 0
  client_optimizer: str = 'sgd'
  client_learning_rate: float = 0.0
  server_optimizer: str = 'sgd'
  server_learning_rate: float = 1.0
  seed: int = 0
  output_dir: str = ''
  model: str = ''
  alpha: float = 0.5
  dirichlet_top_up: bool = False
  kappa: float = 0.5
  quantity_clients: int = 1
  classes_per_client: int = 2
  label_skew_rule: str = 'niid_bench'
  quantity_large_clients: str = 'random'
  kappa_scope: str = 'shared'
  examples_per_client: int = 0
  source_examples: int = 0
  validation_fraction: float = 0.1
  test_fraction: float = 0.2
  server_held_out_examples: int = 0
  public_examples: int = 0
  rotated_client_fraction: float = 0.0
  eval_every: int = 1
  common_test_evaluation: bool = False
  data_dir: str = ''
  max_concurrent_computation_calls: int = -1
  aggregator: str = 'mean'
  dp_noise_multiplier: float = 0.1
  dp_delta: float = 0.0
  dp_target_epsilon: float = 0.0
  attack: str = 'none'
  malicious_fraction: float = 0.0
  attack_scale: float = 10.0
  label_noise_file: str = ''

  settings: Any = dataclasses.field(default_factory=lambda: NoSettings())

  def __post_init__(self):
    if self.dataset not in DATASETS:
      raise ConfigError(
          f'Unknown dataset {self.dataset!r}; choose one of'
          f' {", ".join(DATASETS)}.')
    self._resolve_defaults()
    check_choice('partition', self.partition, PARTITIONS)
    check_choice('client_optimizer', self.client_optimizer, OPTIMIZERS)
    check_choice('server_optimizer', self.server_optimizer, OPTIMIZERS)
    check_choice('aggregator', self.aggregator, AGGREGATORS)
    check_choice('label_skew_rule', self.label_skew_rule, LABEL_SKEW_RULES)
    check_choice('quantity_large_clients', self.quantity_large_clients,
                  QUANTITY_LARGE_CLIENTS)
    check_choice('kappa_scope', self.kappa_scope, KAPPA_SCOPES)
    for name in ('num_clients', 'clients_per_round', 'rounds',
                 'local_epochs', 'batch_size'):
      if getattr(self, name) < 1:
        raise ConfigError(f'{name} must be >= 1, got {getattr(self, name)}.')
    for name in ('examples_per_client', 'source_examples', 'eval_every',
                 'seed',
                 'server_held_out_examples', 'public_examples'):
      if getattr(self, name) < 0:
        raise ConfigError(f'{name} must be >= 0, got {getattr(self, name)}.')
    if not 0.0 <= self.rotated_client_fraction < 1.0:
      raise ConfigError(
          'rotated_client_fraction must be in [0, 1), got'
          f' {self.rotated_client_fraction}.')
    if self.seed > MAX_SEED:
      raise ConfigError(
          f'seed must be in [0, {MAX_SEED}], got {self.seed}; pick a smaller'
          ' seed.')
    if self.model and self.model not in model_names.MODELS:
      raise ConfigError(
          f'Unknown model {self.model!r}; choose one of'
          f' {", ".join(model_names.MODELS)}'
          " (or leave --model empty for the data set's default).")
    if self.clients_per_round > self.num_clients:
      raise ConfigError(
          f'clients_per_round={self.clients_per_round} exceeds'
          f' num_clients={self.num_clients}; sample at most every client.'
      )
    for name in ('client_learning_rate', 'server_learning_rate'):
      check_learning_rate(name, getattr(self, name))
    if self.partition == 'dirichlet' and not (
        math.isfinite(self.alpha) and self.alpha > 0):
      raise ConfigError(
          f'alpha must be > 0 for the Dirichlet partition, got {self.alpha};'
          ' smaller alpha means more skew (0.1 strong, 1.0 mild).'
      )
    if self.partition == 'quantity_skew':
      if not 0 < self.kappa < 1:
        raise ConfigError(f'kappa must be in (0, 1), got {self.kappa}.')
      if not 1 <= self.quantity_clients < self.num_clients:
        raise ConfigError(
            f'quantity_clients must be in [1, num_clients), got'
            f' {self.quantity_clients}.'
        )
      if (self.kappa_scope == 'each' and
          not self.quantity_clients * self.kappa < 1):
        raise ConfigError(
            f'kappa_scope=each gives kappa={self.kappa} of the data to each'
            f' of quantity_clients={self.quantity_clients} clients, more'
            ' than all of it; lower kappa or quantity_clients, or use'
            ' kappa_scope=shared (kappa is then their share together).')
    if self.partition == 'label_skew' and self.classes_per_client < 1:
      raise ConfigError(
          f'classes_per_client must be >= 1, got {self.classes_per_client}.'
      )
    fractions = (self.validation_fraction, self.test_fraction)
    if any(not 0 <= f < 1 for f in fractions) or sum(fractions) >= 1:
      raise ConfigError(
          'validation_fraction and test_fraction must be in [0, 1) and sum'
          f' to less than 1, got {fractions}.'
      )
    if self.test_fraction == 0 and self.partition != 'natural':
      raise ConfigError(
          'test_fraction must be > 0: clients are evaluated on their own'
          ' test split.'
      )
    try:
      self.attack_config()
    except ValueError as e:
      raise ConfigError(str(e)) from e
    if not (math.isfinite(self.dp_noise_multiplier) and
            self.dp_noise_multiplier >= 0):
      raise ConfigError(
          'dp_noise_multiplier must be >= 0, got'
          f' {self.dp_noise_multiplier}.')
    if self.aggregator == 'dp':
      self._resolve_privacy()
    if not (self.max_concurrent_computation_calls == -1
            or self.max_concurrent_computation_calls >= 1):
      raise ConfigError(
          'max_concurrent_computation_calls must be -1 (unlimited) or >= 1,'
          f' got {self.max_concurrent_computation_calls}.')
    if not self.output_dir:
      raise ConfigError('output_dir is required (checkpoints go there).')
    self._check_unread_settings()

  def _check_unread_settings(self) -> None:
    """Refuses a shared setting given where nothing reads it."""
    for name, (other, users) in SETTING_READERS.items():
      value = getattr(self, name)
      if getattr(self, other) in users or value == _DEFAULTS[name]:
        continue
      wanted = ' or '.join(f'--{other}={u}' for u in users)
      raise ConfigError(
          f'--{name}={value} is read only with {wanted}, not with'
          f' --{other}={getattr(self, other)}; drop --{name} or use'
          f' {wanted}.')

  def _resolve_privacy(self) -> None:
    """The DP aggregator's delta and noise: checked, resolved, recorded."""
    delta = self.dp_delta or accounting.default_delta(self.num_clients)
    object.__setattr__(self, 'dp_delta', delta)
    try:
      if self.dp_target_epsilon:
        both = ConfigError(
            f'Give either --dp_noise_multiplier={self.dp_noise_multiplier}'
            f' or --dp_target_epsilon={self.dp_target_epsilon}, not both:'
            ' the target chooses the noise multiplier.')
        given = self.dp_noise_multiplier != _DEFAULTS['dp_noise_multiplier']
        try:
          noise = accounting.noise_for_epsilon(
              self.dp_target_epsilon, self.clients_per_round,
              self.num_clients, self.rounds, delta)
        except ValueError:
          if given:
            raise both from None
          raise
        # (A config resolved before holds the chosen noise already.)
        if given and self.dp_noise_multiplier != noise:
          raise both
        object.__setattr__(self, 'dp_noise_multiplier', noise)
      accounting.check(self.dp_noise_multiplier, self.clients_per_round,
                       self.num_clients, delta)
    except ConfigError:
      raise
    except ValueError as e:
      raise ConfigError(str(e)) from e

  def privacy_epsilon(self, rounds: int) -> float:
    """The global model's epsilon after `rounds` (at `dp_delta`); only for
    the DP aggregator."""
    return accounting.epsilon(self.dp_noise_multiplier,
                              self.clients_per_round, self.num_clients,
                              rounds, self.dp_delta)

  def _resolve_defaults(self) -> None:
    """Fills the settings left at 0 from the data set's defaults.

    The resolved values are what config.json records, so a resumed run is
    checked against the rates it really used.
    """
    defaults = DATASET_DEFAULTS[self.dataset]
    if self.batch_size == 0:
      object.__setattr__(self, 'batch_size', defaults.batch_size)
    if self.client_learning_rate == 0:
      object.__setattr__(self, 'client_learning_rate',
                         defaults.client_learning_rate)

  def attack_config(self) -> attacks.AttackConfig:
    """The attack settings (checked there: the one place they are)."""
    return attacks.AttackConfig(
        kind=self.attack, malicious_fraction=self.malicious_fraction,
        scale=self.attack_scale, seed=self.seed)

  def partition_params(self) -> dict[str, Any]:
    """The keyword arguments of the chosen partition."""
    return {
        'homogeneous': {},
        'natural': {},
        'dirichlet': {'alpha': self.alpha,
                      'top_up': self.dirichlet_top_up},
        'quantity_skew': {'kappa': self.kappa, 'm': self.quantity_clients,
                          'large_clients': self.quantity_large_clients,
                          'kappa_scope': self.kappa_scope},
        'label_skew': {'classes_per_client': self.classes_per_client,
                       'rule': self.label_skew_rule},
    }[self.partition]

  def to_dict(self) -> dict[str, Any]:
    """Every setting by name, the algorithm's own beside the shared ones.

    The flat form of config.json (and of the flags): the algorithm's
    setting names are distinct from the shared ones.
    """
    values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
              if f.name != 'settings'}
    values.update(dataclasses.asdict(self.settings))
    return values

  def defaults(self) -> dict[str, Any]:
    """`to_dict`'s names with their defaults (the algorithm's included)."""
    return {**_DEFAULTS, **settings_defaults(type(self.settings))}

  def resumable_fields(self) -> frozenset[str]:
    """The settings that may differ on resumption (shared and own).

    An algorithm's settings may name shared ones of `RESUMABLE_FIELDS`
    that its training reads, so they must not change (a class attribute
    `fixed_on_resume`: FedDF distils on the server's validation set).
    """
    fixed = frozenset(getattr(type(self.settings), 'fixed_on_resume', ()))
    return (RESUMABLE_FIELDS - fixed) | frozenset(
        f.name for f in dataclasses.fields(self.settings)
        if f.metadata.get('resumable'))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)
             if f.name != 'settings'}


def is_default(config: RunConfig, name: str) -> bool:
  """Whether shared setting `name` has the value it gets when not given.

  For `clients_per_round` that is every client; for `batch_size` and
  `client_learning_rate` the data set's (`DATASET_DEFAULTS`).
  """
  value = getattr(config, name)
  if name == 'clients_per_round':
    return value == config.num_clients
  if name in ('batch_size', 'client_learning_rate'):
    return value == getattr(DATASET_DEFAULTS[config.dataset], name)
  return value == _DEFAULTS[name]


def reads_value(reads: Reads, name: str, value: Any) -> bool:
  """Whether an algorithm reading `reads` acts on `name` set to `value`."""
  return name in reads and (reads[name] is None or value in reads[name])


def unread_settings(config: RunConfig, reads: Reads) -> list[str]:
  """The algorithm-dependent settings `config` gives that `reads` ignores.

  A setting at its default (`is_default`) is never among them.
  """
  return [name for name in ALGORITHM_DEPENDENT
          if not is_default(config, name)
          and not reads_value(reads, name, getattr(config, name))]


def setting(default: Any, help_text: str, *, choices: Sequence[str] = (),
            resumable: bool = False) -> Any:
  """A field of an algorithm's settings, with what its flag shows.

  Args:
    default: The value when the flag is not given.
    help_text: The flag's help (the program prefixes the algorithms that
      read it).
    choices: The allowed values of a string setting (its flag is an enum).
    resumable: Whether a resumed run may change it (it acts after training,
      or only on what is still to come).

  Returns:
    A `dataclasses.field` for a frozen settings dataclass.
  """
  return dataclasses.field(default=default, metadata={
      'help': help_text, 'choices': tuple(choices), 'resumable': resumable})


@dataclasses.dataclass(frozen=True)
class NoSettings:
  """The settings of an algorithm that has none of its own."""


def settings_defaults(settings_type: type[Any]) -> dict[str, Any]:
  """{name: default} of a settings dataclass."""
  return {f.name: f.default for f in dataclasses.fields(settings_type)}


def check_learning_rate(name: str, value: float) -> None:
  """A learning rate must be a finite number > 0."""
  if not (math.isfinite(value) and value > 0):
    raise ConfigError(f'{name} must be a positive number, got {value}.')


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
  """Refuses `value` unless it is one of `choices`, listing them."""
  if value not in choices:
    raise ConfigError(
        f'Unknown {name} {value!r}; choose one of {", ".join(choices)}.'
    )


def incompatible_settings(
    saved: dict[str, Any], current: RunConfig,
    reads: Optional[Reads] = None,
) -> list[str]:
  """Human-readable differences that forbid resuming `saved` as `current`.

  A setting missing from `saved` (added to tff_fair after that run began)
  counts as what that run used: its default, or for a setting in
  `LEGACY_VALUES` that acted on the run (under its partition, variant...),
  the old value (the default changed since). Settings `current` does not read (another
  algorithm's, an `ALGORITHM_DEPENDENT` one its algorithm ignores, or
  `SETTING_READERS`: another partition's, ...) are not compared: they never
  acted on the run (the algorithm is compared, so it is the saved run's).

  Args:
    saved: The saved run's config.json.
    current: The settings asked for now.
    reads: What `current`'s algorithm reads (`Recipe.settings_read`);
      None compares every algorithm-dependent setting.
  """
  now = current.to_dict()
  defaults = current.defaults()
  resumable = current.resumable_fields()
  differences = []
  for key in sorted(set(saved) | set(now)):
    if key in resumable or key not in now:
      continue
    # A setting the run does not read never acted on the saved run (runs
    # saved before such settings were refused may hold any value); the
    # setting it depends on is compared on its own.
    other, users = SETTING_READERS.get(key, (None, ()))
    if other is not None and getattr(current, other) not in users:
      continue
    if (reads is not None and key in ALGORITHM_DEPENDENT
        and key not in reads):
      continue
    legacy = None
    if key not in saved and key in LEGACY_VALUES:
      (under, value), old = LEGACY_VALUES[key]
      if saved.get(under, defaults.get(under)) == value:
        legacy = old
    was = saved.get(key, defaults[key] if legacy is None else legacy)
    if was != now[key]:
      difference = f'{key}: saved run has {was!r}, this run asks {now[key]!r}'
      if legacy is not None:
        difference += (
            f' (the saved run predates the {key} setting; tff_fair then'
            f' always used {legacy!r}: pass --{key}={legacy} to resume it)')
      differences.append(difference)
  return differences


def check_resumable(config: RunConfig, reads: Optional[Reads] = None
                    ) -> Optional[dict[str, Any]]:
  """Checks `config` against the run saved in its output directory.

  Reads only; nothing is written or removed. `reads`: as in
  `incompatible_settings`.

  Returns:
    The saved configuration when one exists (a resumption), else None.

  Raises:
    ConfigError: If the output directory holds a run with other settings.
  """
  saved = load_saved(config.output_dir)
  if saved is None:
    return None
  differences = incompatible_settings(saved, config, reads)
  if differences:
    raise ConfigError(
        f'{config.output_dir} holds a run with other settings, so it cannot'
        ' be resumed with these:\n  ' + '\n  '.join(differences) +
        '\nRe-run with the saved settings, or choose a new --output_dir.'
    )
  return saved


def load_saved(output_dir: str) -> Optional[dict[str, Any]]:
  """The settings saved in `output_dir`, or None when there are none.

  Raises:
    ConfigError: If `config.json` is unreadable or not a JSON object.
  """
  path = os.path.join(output_dir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      saved = json.load(f)
  except OSError as e:
    raise ConfigError(
        f'{path} cannot be read ({e}); fix its permissions, or use another'
        ' --output_dir.') from e
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(
        f'{path} is not valid JSON ({e}); it was not written by tff_fair'
        ' or was damaged. Use another --output_dir.'
    ) from e
  if not isinstance(saved, dict):
    raise ConfigError(
        f'{path} holds a JSON {type(saved).__name__}, not the object of'
        ' settings tff_fair writes; it was not written by tff_fair or was'
        ' damaged. Use another --output_dir.')
  return saved


def save_if_new(config: RunConfig, replace: bool = False) -> None:
  """Writes `config.json` atomically; an existing one is kept.

  Args:
    config: The run's settings.
    replace: Overwrite an existing file (that of a run which never reached
      its first checkpoint, or one the user asked to start over).
  """
  os.makedirs(config.output_dir, exist_ok=True)
  path = os.path.join(config.output_dir, CONFIG_FILE)
  if os.path.exists(path) and not replace:
    return
  files.write_atomically(
      path, lambda f: json.dump(config.to_dict(), f, indent=2, sort_keys=True))
