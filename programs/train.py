r"""Trains a tff_fair algorithm on a federated data set; resumable.

Example (`make demo`, the README's main job):

  python -m programs.train --algorithm=fedavg --dataset=fashion_mnist \
      --partition=dirichlet --alpha=0.5 --num_clients=10 --rounds=5 \
      --output_dir=runs/demo

Re-running the same command after an interruption resumes from the last
completed round. Exit status (`EXIT_CODES`): 2 for a bad flag, setting,
input file, data set or saved run, reported as one message without a
traceback before anything is written or trained; 3 when a remote TFF worker
is unreachable or lost (restart it and re-run); 1 with a traceback for an
internal error. --help shows the key flags, --helpfull every flag by
topic; docs/running.md describes them and the output directory.
"""

# Before anything imports TensorFlow: keep its start-up noise off the terminal.
from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

import dataclasses
import sys
from typing import Optional

from absl import app
from absl import flags
from absl import logging

from tff_fair import attacks
from tff_fair import errors
from tff_fair.models import names as model_names
from tff_fair.runtime import execution
from tff_fair.runtime import remote
from tff_fair.training import config as config_lib
from tff_fair.training import driver
from tff_fair.training import log_filter
from tff_fair.training.recipes import registry

_DEFAULTS = config_lib.RunConfig(output_dir='unused')

# absl's --helpfull lists flags by the module that defines them, modules in
# sorted order: these names group them by topic instead, as docs/running.md
# does. `--help` shows the key flags (`_KEY_FLAGS`).
_DATA = '1. data'
_TRAINING = '2. training'
_ALGORITHM = '3. algorithm settings, --algorithm='
_RUNTIME = '4. runtime'
_OUTPUT = '5. evaluation and output'
# Topic -> group, for docs/running.md (`python -m tools.render_docs`).
FLAG_GROUPS = {'data': _DATA, 'training': _TRAINING, 'runtime': _RUNTIME,
               'output': _OUTPUT}
_KEY_FLAGS = ('algorithm', 'dataset', 'partition', 'num_clients', 'rounds',
              'output_dir')

flags.DEFINE_enum('algorithm', registry.DEFAULT_ALGORITHM, registry.names(),
                  'Training algorithm (docs/algorithms/<name>.md).',
                  module_name=_TRAINING)
flags.DEFINE_string('dataset', _DEFAULTS.dataset,
                    'fashion_mnist, mnist, cifar10, femnist, shakespeare,'
                    ' sst2 or digits.',
                    module_name=_DATA)
flags.DEFINE_string('data_dir', '', 'Data directory; default'
                    ' $TFF_FAIR_DATA_DIR (layout: docs/data.md).',
                    module_name=_DATA)
flags.DEFINE_enum('partition', _DEFAULTS.partition, config_lib.PARTITIONS,
                  'How examples are split among clients.',
                  module_name=_DATA)
flags.DEFINE_float('alpha', _DEFAULTS.alpha, 'Dirichlet concentration.',
                   module_name=_DATA)
flags.DEFINE_bool('dirichlet_top_up', _DEFAULTS.dirichlet_top_up,
                  'dirichlet: one draw, small clients topped up from the'
                  ' largest (for many clients; see tff_fair.data.partition).',
                  module_name=_DATA)
flags.DEFINE_float('kappa', _DEFAULTS.kappa,
                   'quantity_skew: share of data held by the large clients.',
                   module_name=_DATA)
flags.DEFINE_integer('quantity_clients', _DEFAULTS.quantity_clients,
                     'quantity_skew: number of large clients.',
                     module_name=_DATA)
flags.DEFINE_integer('classes_per_client', _DEFAULTS.classes_per_client,
                     'label_skew: classes per client (#C=m).',
                     module_name=_DATA)
flags.DEFINE_enum('label_skew_rule', _DEFAULTS.label_skew_rule,
                  config_lib.LABEL_SKEW_RULES,
                  'label_skew: how classes are assigned. niid_bench: client'
                  ' i holds class i mod K plus m-1 others drawn at random'
                  ' (seeded), as in NIID-Bench, IAFL and Aequa; a class no'
                  ' client draws (only with fewer clients than classes) is'
                  ' left unused. cyclic: m consecutive classes around one'
                  ' random cycle (with m dividing K only K/m distinct,'
                  ' disjoint class sets); the rule of runs saved by older'
                  ' tff_fair versions, which resume only with it.',
                  module_name=_DATA)
flags.DEFINE_enum('quantity_large_clients', _DEFAULTS.quantity_large_clients,
                  config_lib.QUANTITY_LARGE_CLIENTS,
                  'quantity_skew: which clients are large. random:'
                  ' --quantity_clients clients drawn at random (seeded);'
                  ' first: clients 0..m-1 (the rule of runs saved by older'
                  ' tff_fair versions, which resume only with it).',
                  module_name=_DATA)
flags.DEFINE_enum('kappa_scope', _DEFAULTS.kappa_scope,
                  config_lib.KAPPA_SCOPES,
                  'quantity_skew: shared: --kappa is the large clients\''
                  ' share of the data together (IAFL\'s reading); each: each'
                  ' large client holds kappa of it (the Aequa paper\'s'
                  ' wording; needs quantity_clients * kappa < 1).',
                  module_name=_DATA)
flags.DEFINE_integer('num_clients', _DEFAULTS.num_clients, 'Clients.',
                     module_name=_DATA)
flags.DEFINE_integer('clients_per_round', None,
                     'Clients sampled per round (default: all).',
                     module_name=_TRAINING)
flags.DEFINE_integer('examples_per_client', 0,
                     'Cap on each client\'s examples (0: no cap).',
                     module_name=_DATA)
flags.DEFINE_integer('source_examples', 0,
                     'Use a stratified subset of this many examples of the'
                     ' data set before partitioning (0: all); keeps a'
                     ' quantity skew\'s proportions, unlike a per-client'
                     ' cap.', module_name=_DATA)
flags.DEFINE_float('validation_fraction', _DEFAULTS.validation_fraction,
                   'Share of each client\'s data held out for validation.',
                   module_name=_DATA)
flags.DEFINE_float('test_fraction', _DEFAULTS.test_fraction,
                   'Share of each client\'s data held out for testing.',
                   module_name=_DATA)
flags.DEFINE_integer('server_held_out_examples', 0,
                     'Size of each of the server\'s held-out validation and'
                     ' test sets, drawn from examples no client holds (0:'
                     ' none); read where models are judged on common'
                     ' held-out data (Aequa\'s rewards, IAFL\'s standalone'
                     ' contributions, --common_test_evaluation).',
                     module_name=_DATA)
flags.DEFINE_integer('public_examples', 0,
                     'Size of a public set of examples no client holds,'
                     ' which distillation algorithms share (0: none).',
                     module_name=_DATA)
flags.DEFINE_float('rotated_client_fraction',
                   _DEFAULTS.rotated_client_fraction,
                   'Share of the clients (a seeded choice) whose images are'
                   ' rotated 180 degrees in all their splits: a concept'
                   ' shift, e.g. for --algorithm=cfl (0: none).',
                   module_name=_DATA)
flags.DEFINE_integer('rounds', _DEFAULTS.rounds, 'Federated rounds.',
                     module_name=_TRAINING)
flags.DEFINE_integer('local_epochs', _DEFAULTS.local_epochs,
                     'Client epochs per round.',
                     module_name=_TRAINING)
flags.DEFINE_integer(
    'batch_size', 0, 'Batch size (0: the data set\'s: '
    + config_lib.dataset_defaults_help('batch_size') + ').',
                     module_name=_TRAINING)
flags.DEFINE_enum('client_optimizer', _DEFAULTS.client_optimizer,
                  config_lib.OPTIMIZERS, 'Client optimizer.',
                  module_name=_TRAINING)
flags.DEFINE_float(
    'client_learning_rate', 0.0, 'Client learning rate (0: the data set\'s:'
    ' ' + config_lib.dataset_defaults_help('client_learning_rate') + ').',
                   module_name=_TRAINING)
flags.DEFINE_enum('server_optimizer', _DEFAULTS.server_optimizer,
                  config_lib.OPTIMIZERS, 'Server optimizer.',
                  module_name=_TRAINING)
flags.DEFINE_float('server_learning_rate', _DEFAULTS.server_learning_rate,
                   'Server learning rate.',
                   module_name=_TRAINING)
flags.DEFINE_string(
    'model', '', 'Architecture: one of ' + ', '.join(model_names.PLAIN_MODELS)
    + '; for --algorithm=' + ' or '.join(
        name for name in registry.names() if registry.get(name).slimmable)
    + ' one of ' + ', '.join(model_names.SLIMMABLE_MODELS)
    + ' (default: the data set\'s: ' + config_lib.dataset_defaults_help('model')
    + ').',
                    module_name=_TRAINING)
flags.DEFINE_integer('eval_every', _DEFAULTS.eval_every,
                     'Evaluate every client every N rounds (0: at the end).',
                     module_name=_OUTPUT)
flags.DEFINE_bool(
    'common_test_evaluation', _DEFAULTS.common_test_evaluation,
    'After the last round, also measure each client\'s final model(s) on the'
    ' common test set (the server\'s held-out test set, else all clients\''
    ' test splits pooled), as CGSV, IAFL and Aequa judge rewards: model kinds'
    ' <kind>:common_test in clients_final.csv.',
                  module_name=_OUTPUT)
flags.DEFINE_integer('seed', _DEFAULTS.seed, 'Random seed.',
                     module_name=_TRAINING)
flags.DEFINE_string('output_dir', None, 'Checkpoints and results.',
                    module_name=_OUTPUT)
flags.DEFINE_enum('aggregator', _DEFAULTS.aggregator, config_lib.AGGREGATORS,
                  'Aggregation of the global model\'s client updates.',
                  module_name=_TRAINING)
flags.DEFINE_float('dp_noise_multiplier', _DEFAULTS.dp_noise_multiplier,
                   'Noise multiplier of --aggregator=dp, below 0.1 per'
                   ' client of a round (TFF\'s adaptive clipping).',
                   module_name=_TRAINING)
flags.DEFINE_float('dp_delta', _DEFAULTS.dp_delta,
                   '--aggregator=dp: the delta of the reported (epsilon,'
                   ' delta), below 1/num_clients (0: 1/num_clients^1.1).',
                   module_name=_TRAINING)
flags.DEFINE_float('dp_target_epsilon', _DEFAULTS.dp_target_epsilon,
                   '--aggregator=dp: a privacy budget; the run takes the'
                   ' smallest noise multiplier whose epsilon after --rounds'
                   ' is at most this (0: use --dp_noise_multiplier).',
                   module_name=_TRAINING)
flags.DEFINE_enum('attack', _DEFAULTS.attack, attacks.ATTACKS,
                  'Byzantine attack of the malicious clients.',
                  module_name=_TRAINING)
flags.DEFINE_float('malicious_fraction', _DEFAULTS.malicious_fraction,
                   'Fraction of clients that attack.',
                   module_name=_TRAINING)
flags.DEFINE_float('attack_scale', _DEFAULTS.attack_scale,
                   'model_replacement: update multiplier.',
                   module_name=_TRAINING)
flags.DEFINE_string('label_noise_file', _DEFAULTS.label_noise_file,
                    'JSON {client_id: fraction} of each named client\'s'
                    ' training labels replaced by random classes (1: a free'
                    ' rider; clients not named keep their labels).',
                    module_name=_DATA)


def _define_algorithm_flags() -> None:
  """One flag per algorithm setting, from its recipe's `Settings` field.

  `--helpfull` lists each under the algorithms that read it.
  """
  for field, owners in registry.setting_fields():
    help_text = f'{"/".join(owners)}: {field.metadata["help"]}'
    group = {'module_name': _ALGORITHM + ' or '.join(owners)}
    if field.metadata['choices']:
      flags.DEFINE_enum(field.name, field.default, field.metadata['choices'],
                        help_text, **group)
    elif isinstance(field.default, bool):
      flags.DEFINE_bool(field.name, field.default, help_text, **group)
    elif isinstance(field.default, int):
      flags.DEFINE_integer(field.name, field.default, help_text, **group)
    elif isinstance(field.default, float):
      flags.DEFINE_float(field.name, field.default, help_text, **group)
    else:
      flags.DEFINE_string(field.name, field.default, help_text, **group)


_define_algorithm_flags()
flags.DEFINE_integer('max_concurrent_computation_calls', -1,
                     'Local TFF worker concurrency (-1: unlimited).',
                     module_name=_RUNTIME)
flags.DEFINE_enum('executor', 'local', execution.EXECUTORS,
                  'local: a TFF worker process of our own; remote: the TFF'
                  ' workers in --workers (python -m programs.worker).',
                  module_name=_RUNTIME)
flags.DEFINE_string('workers', '', 'remote: host:port,... of running TFF'
                    ' workers; several split each round\'s clients.',
                    module_name=_RUNTIME)
flags.DEFINE_bool('start_over', False,
                  'Discard the run saved in --output_dir (settings,'
                  ' checkpoints, personal models, metrics, tables; other'
                  ' files are kept) and train from round 0.',
                  module_name=_OUTPUT)
flags.DEFINE_bool('checkpoint_fallback', False,
                  'If the latest checkpoint is damaged, resume from the'
                  ' newest intact one (the damaged ones are renamed'
                  ' *_damaged) instead of stopping.',
                  module_name=_OUTPUT)
flags.mark_flag_as_required('output_dir')
for _name in _KEY_FLAGS:
  flags.declare_key_flag(_name)

FLAGS = flags.FLAGS
# Generated from the recipes' declarations: which algorithms ignore a flag.
for _setting in config_lib.ALGORITHM_DEPENDENT:
  FLAGS[_setting].help = ' '.join(filter(None, (
      FLAGS[_setting].help, registry.ignored_by_help(_setting))))

# The one map from error types to exit statuses (first match wins). Every
# error a user can fix is an `errors.UserError`.
EXIT_CODES = (
    (errors.UserError, 2),
    (remote.WorkerUnavailableError, 3),
)
USAGE_EXIT_CODE = 2


def exit_code(error: BaseException) -> Optional[int]:
  """The exit status for `error`, or None for an internal error."""
  for error_type, code in EXIT_CODES:
    if isinstance(error, error_type):
      return code
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, but a bad flag value exits with status 2."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write(f'FATAL Flags parsing error: {e}\n'
                     'Pass --helpshort or --helpfull to see help on flags.\n')
    sys.exit(USAGE_EXIT_CODE)


def config_from_flags() -> config_lib.RunConfig:
  names = [f.name for f in dataclasses.fields(config_lib.RunConfig)
           if f.name != 'settings']
  names += [field.name for field, _ in registry.setting_fields()]
  values = {name: FLAGS[name].value for name in names}
  if values['clients_per_round'] is None:
    values['clients_per_round'] = values['num_clients']
  return registry.make_config(**values)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}',
                         exitcode=USAGE_EXIT_CODE)
  log_filter.keep_info_logs_of_tff_fair_only()
  try:
    config = config_from_flags()
    if FLAGS.executor == 'remote' and FLAGS.workers:
      # Before connecting: the driver checks it again in the context.
      registry.check_workers(config.algorithm,
                             len(remote.parse_workers(FLAGS.workers)))
    with execution.execution_context(
        FLAGS.executor, FLAGS.workers,
        FLAGS.max_concurrent_computation_calls):
      driver.run(config, start_over=FLAGS.start_over,
                 checkpoint_fallback=FLAGS.checkpoint_fallback)
  except Exception as e:  # pylint: disable=broad-except
    code = exit_code(e)
    if code is None:
      raise  # An internal error: keep its traceback.
    logging.error('%s', e)
    sys.exit(code)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
