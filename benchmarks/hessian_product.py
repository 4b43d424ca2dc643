"""How far Per-FedAvg's finite-difference Hessian-vector product is off.

Plain script (not a test, not in Bazel), from the repository root:

    .venv/bin/python -m benchmarks.hessian_product [--dataset=femnist
        --partition=natural --num_clients=40 --epochs=3 --deltas=...]

Per-FedAvg's Hessian-free meta-step needs h = H g, the Hessian of a client's
loss on a batch D'' at the global model theta times the meta-gradient
g = grad f(theta - alpha grad f(theta; D); D'). The paper approximates it by
[grad f(theta + delta g) - grad f(theta - delta g)] / (2 delta);
`per_fedavg.hessian_vector_product` computes it exactly. For each client
(its first three training batches as D, D', D'', as the meta-loop reads
them) this measures the relative error ||h_fd - h|| / ||h|| at each radius
delta, at the initial model and after `--epochs` of centralized SGD on the
clients' pooled training data (the data set's default model, batch and
learning rate), and how large the correction alpha ||h|| / ||g|| is.

With `--results_file` it also writes the results as JSON
(`benchmarks/report.py`): table `errors`, a row per model (initial,
trained) and delta with the median and 90th percentile over clients of the
relative error, and the median correction.
"""

from tff_fair.runtime import quiet_startup  # pylint: disable=g-bad-import-order
quiet_startup.import_tensorflow_quietly()

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from benchmarks import report
from tff_fair.algorithms import per_fedavg
# Imported for its side effect: TFF's import-time context is replaced by one
# that exits cleanly.
from tff_fair.runtime import local  # pylint: disable=unused-import
from tff_fair.training import driver
from tff_fair.training.recipes import registry

_DATASET = flags.DEFINE_string('dataset', 'femnist', 'A data set name.')
_PARTITION = flags.DEFINE_string('partition', 'natural', 'Its partition.')
_NUM_CLIENTS = flags.DEFINE_integer('num_clients', 40, 'Clients measured.')
_EPOCHS = flags.DEFINE_integer(
    'epochs', 3, 'Epochs of centralized SGD before the second measurement.')
_ALPHA = flags.DEFINE_float('alpha', 0.01, "Per-FedAvg's inner step size.")
_DELTAS = flags.DEFINE_list('deltas', ['1e-2', '1e-3', '1e-4', '1e-5'],
                            'Finite-difference radii; 1e-3 is the paper\'s.')
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'See docs/data.md.')
_SEED = flags.DEFINE_integer('seed', 0, 'Partition and model seed.')
_RESULTS_FILE = flags.DEFINE_string(
    'results_file', '', 'Also write the results as JSON here (schema:'
    ' benchmarks/report.py).')


def _norm(tensors) -> float:
  return float(tf.sqrt(tf.add_n([tf.reduce_sum(t * t) for t in tensors])))


def _measure(model, client_batches, deltas):
  """{delta: [relative error per client]}, [alpha ||h|| / ||g|| per client]."""
  variables = model.trainable_variables
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  theta = [tf.identity(v) for v in variables]

  def loss_on(batch):
    return lambda: loss(batch['y'], model(batch['x'], training=True))

  def gradient(batch):
    with tf.GradientTape() as tape:
      value = loss_on(batch)()
    return tape.gradient(value, variables)

  errors = {delta: [] for delta in deltas}
  corrections = []
  for d, d_prime, d_second in client_batches:
    for v, t in zip(variables, theta):
      v.assign(t)
    inner = gradient(d)
    for v, t, g in zip(variables, theta, inner):
      v.assign(t - _ALPHA.value * g)
    meta_grad = gradient(d_prime)
    for v, t in zip(variables, theta):
      v.assign(t)
    exact = per_fedavg.hessian_vector_product(
        loss_on(d_second), variables, meta_grad)
    size = _norm(exact)
    corrections.append(_ALPHA.value * size / _norm(meta_grad))
    for delta in deltas:
      approximate = per_fedavg.finite_difference_product(
          loss_on(d_second), variables, meta_grad, delta)
      errors[delta].append(
          _norm([a - e for a, e in zip(approximate, exact)]) / size)
  return errors, corrections


def main(argv):
  del argv
  results = report.Results('hessian_product', {
      name: flags.FLAGS[name].value for name in (
          'dataset', 'partition', 'num_clients', 'epochs', 'alpha', 'deltas',
          'seed')})
  deltas = [float(d) for d in _DELTAS.value]
  tf.keras.utils.set_random_seed(_SEED.value)  # The training's shuffle.
  config = registry.make_config(
      dataset=_DATASET.value, partition=_PARTITION.value,
      num_clients=_NUM_CLIENTS.value, seed=_SEED.value,
      data_dir=_DATA_DIR.value, output_dir='unused')
  experiment = driver.build_experiment(config)
  data = experiment.data
  batch_size = config.batch_size
  client_batches = []
  for client_id in data.client_ids:
    batches = list(data.dataset(client_id, 'train').batch(batch_size).take(3))
    if len(batches) == 3:  # A client with fewer batches reuses them.
      client_batches.append(batches)
  model = experiment.plain_model_spec.build_keras(_SEED.value)
  model.compile(
      optimizer=tf.keras.optimizers.SGD(config.client_learning_rate),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  pooled = [data.arrays(client_id, 'train') for client_id in data.client_ids]
  x = np.concatenate([p[0] for p in pooled])
  y = np.concatenate([p[1] for p in pooled])

  rows = []
  columns = (
      report.Column('model', 'model'),
      report.Column('delta', 'delta', '.0e'),
      report.Column('median_error', 'median error', '.3f'),
      report.Column('p90_error', '90th pct. error', '.3f'),
      report.Column('correction', 'median α‖h‖ / ‖g‖', '.3f'))
  print(f'{config.dataset} {config.partition}, {len(client_batches)} clients'
        f' with 3 batches of {batch_size}, model {experiment.model_spec.name}')
  print(f'{"model":>8} {"delta":>7} {"median err":>11} {"p90 err":>9}'
        f' {"α‖h‖/‖g‖":>13}')
  for stage in ('initial', 'trained'):
    if stage == 'trained':
      model.fit(x, y, batch_size=batch_size, epochs=_EPOCHS.value,
                shuffle=True, verbose=0)
    errors, corrections = _measure(model, client_batches, deltas)
    for delta in deltas:
      row = dict(model=stage, delta=delta,
                 median_error=float(np.median(errors[delta])),
                 p90_error=float(np.percentile(errors[delta], 90)),
                 correction=float(np.median(corrections)))
      rows.append(row)
      print(f'{stage:>8} {delta:>7.0e} {row["median_error"]:>11.3f}'
            f' {row["p90_error"]:>9.3f} {row["correction"]:>13.3f}')
    results.table(
        'errors', 'Relative error of the finite-difference product'
        f' ‖h_fd − h‖ / ‖h‖ over {len(client_batches)} clients, at the'
        f' initial model and after {_EPOCHS.value} epochs', columns, rows)
    results.save(_RESULTS_FILE.value)
  results.write(_RESULTS_FILE.value)


if __name__ == '__main__':
  app.run(main)
