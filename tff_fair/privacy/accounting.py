"""The privacy a run with the DP aggregator buys: (epsilon, delta) per round.

`--aggregator=dp` is TFF's `tff.learning.dp_aggregator`: user-level DP-FedAvg
(McMahan et al. 2018) with adaptive clipping (Andrew et al. 2021), whose
noise multiplier z is the effective total one, the clipped-count estimate
included. Each round adds Gaussian noise of z times the clipping norm to
the sum of the sampled clients' clipped updates: a Gaussian mechanism on
the round's sample, composed over the rounds.

The sampling is the run's own: `clients_per_round` of the `num_clients`
clients, drawn uniformly without replacement each round
(`tff_fair.training.sampling`). The accountant is `dp_accounting`'s RDP
accountant with the matching event, `SampledWithoutReplacementDpEvent`,
whose guarantee holds for the replace-one neighbouring relation: two
federations differ in the whole data of one client (user-level DP). A
guarantee under replace-one is the standard one for fixed-size samples;
under add-or-remove-one (the relation of Poisson sampling, which TFF's
tutorials use) the run makes no claim.

`epsilon` is a function of the round alone, so a resumed run continues the
series exactly. `noise_for_epsilon` finds the smallest noise multiplier
whose epsilon after the run's rounds stays within a target.

numpy and dp_accounting only: no TensorFlow.
"""

import functools
import math

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np

# `tff.learning.dp_aggregator`'s adaptive clipping noises the clipped count
# with stddev 0.05 * clients_per_round and needs the total noise multiplier
# below twice that (TFF's `adaptive_clip_noise_params`).
CLIPPED_COUNT_STDDEV_PER_CLIENT = 0.05
# `noise_for_epsilon` finds the noise multiplier to this relative precision
# (the epsilon it gives lies within 2% below the target).
NOISE_PRECISION = 1e-3


def max_noise_multiplier(clients_per_round: int) -> float:
  """The bound the DP aggregator sets on z (exclusive): 0.1 per client."""
  return 2 * CLIPPED_COUNT_STDDEV_PER_CLIENT * clients_per_round


def update_noise_multiplier(noise_multiplier: float,
                            clients_per_round: int) -> float:
  """The noise multiplier the DP aggregator puts on the clipped updates.

  Adaptive clipping spends part of `noise_multiplier` on the clipped count,
  so the updates get more noise than the nominal multiplier (the two
  compose to it): (z^-2 - (2 sigma_count)^-2)^-1/2. Near the bound it grows
  without limit, which is why a small epsilon with few clients a round
  buys a model no better than chance.
  """
  count_stddev = CLIPPED_COUNT_STDDEV_PER_CLIENT * clients_per_round
  return (noise_multiplier**-2 - (2 * count_stddev)**-2)**-0.5


def default_delta(num_clients: int) -> float:
  """delta = 1 / num_clients^1.1: below 1 / num_clients, as it must be."""
  return 1.0 / num_clients**1.1


def check(noise_multiplier: float, clients_per_round: int, num_clients: int,
          delta: float) -> None:
  """Refuses settings the accounting or the DP aggregator cannot take.

  Raises:
    ValueError: Naming the setting, for delta outside (0, 1/num_clients),
      a noise multiplier <= 0 or at the DP aggregator's bound, or more
      clients per round than clients.
  """
  if not 1 <= clients_per_round <= num_clients:
    raise ValueError(f'clients_per_round={clients_per_round} must be in [1,'
                     f' num_clients={num_clients}].')
  if not (math.isfinite(delta) and 0 < delta < 1 / num_clients):
    raise ValueError(
        f'dp_delta must be in (0, 1/num_clients) = (0, {1 / num_clients:.3g}),'
        f' got {delta}: a delta of 1/num_clients or more allows releasing a'
        ' client\'s data outright. Leave it at 0 for'
        f' 1/num_clients^1.1 = {default_delta(num_clients):.3g}.')
  bound = max_noise_multiplier(clients_per_round)
  if not (math.isfinite(noise_multiplier) and 0 <= noise_multiplier < bound):
    raise ValueError(
        f'dp_noise_multiplier must be in [0, {bound:g}) with'
        f' clients_per_round={clients_per_round}, got {noise_multiplier}:'
        ' TFF\'s DP aggregator estimates its clipping norm from a noisy count'
        ' of clipped clients, which limits the noise to 0.1 per client of'
        ' the round. Sample more clients per round, or lower the noise.')


def dp_event(noise_multiplier: float, clients_per_round: int,
             num_clients: int) -> dp_accounting.DpEvent:
  """One round: the Gaussian mechanism on a sample without replacement."""
  gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
  if clients_per_round == num_clients:
    return gaussian  # Every client, every round: no amplification.
  return dp_accounting.SampledWithoutReplacementDpEvent(
      num_clients, clients_per_round, gaussian)


def epsilon(noise_multiplier: float, clients_per_round: int,
            num_clients: int, rounds: int, delta: float) -> float:
  """The global model's epsilon after `rounds` rounds, at `delta`.

  Infinite without noise (the DP aggregator then only clips).

  Raises:
    ValueError: As `check`, and for rounds < 0.
  """
  check(noise_multiplier, clients_per_round, num_clients, delta)
  if rounds < 0:
    raise ValueError(f'rounds must be >= 0, got {rounds}.')
  if rounds == 0:
    return 0.0
  if noise_multiplier == 0:
    return math.inf
  orders, rdp = _round_rdp(float(noise_multiplier), int(clients_per_round),
                           int(num_clients))
  # Composing `rounds` identical events adds their RDP (as the accountant's
  # `compose(event, rounds)` does).
  return float(rdp_privacy_accountant.compute_epsilon(
      orders, rounds * rdp, delta)[0])


@functools.lru_cache(maxsize=256)
def _round_rdp(noise_multiplier: float, clients_per_round: int,
               num_clients: int) -> tuple[np.ndarray, np.ndarray]:
  """(orders, RDP) of one round, by dp_accounting's RDP accountant.

  Computed once per setting: a subsampled Gaussian's RDP takes about a
  second, and a run releases epsilon every round. dp_accounting has no
  public accessor of an accountant's RDP curve, hence its `_rdp`.
  """
  accountant = rdp_privacy_accountant.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  accountant.compose(
      dp_event(noise_multiplier, clients_per_round, num_clients))
  # pylint: disable-next=protected-access
  return np.array(accountant._orders), np.array(accountant._rdp)


def _largest_noise(clients_per_round: int) -> float:
  """The largest noise multiplier `noise_for_epsilon` considers."""
  return max_noise_multiplier(clients_per_round) * (1 - NOISE_PRECISION)


def smallest_epsilon(clients_per_round: int, num_clients: int, rounds: int,
                     delta: float) -> float:
  """The least epsilon any noise the DP aggregator takes can spend."""
  return epsilon(_largest_noise(clients_per_round), clients_per_round,
                 num_clients, rounds, delta)


@functools.lru_cache(maxsize=64)
def noise_for_epsilon(target_epsilon: float, clients_per_round: int,
                      num_clients: int, rounds: int, delta: float) -> float:
  """The smallest noise multiplier whose epsilon after `rounds` <= target.

  Found by bisection to `NOISE_PRECISION` (relative), rounded up, so the
  epsilon it gives lies at most about 2% below the target.

  Raises:
    ValueError: For a target not > 0, or one no noise the DP aggregator
      accepts reaches (`max_noise_multiplier`): the message says by how
      much, and what would reach it.
  """
  if not (math.isfinite(target_epsilon) and target_epsilon > 0):
    raise ValueError(
        f'dp_target_epsilon must be a finite number > 0, got'
        f' {target_epsilon}.')
  if rounds < 1:
    raise ValueError(f'rounds must be >= 1, got {rounds}.')
  bound = max_noise_multiplier(clients_per_round)
  high = _largest_noise(clients_per_round)
  best = smallest_epsilon(clients_per_round, num_clients, rounds, delta)
  if best > target_epsilon:
    raise ValueError(
        f'dp_target_epsilon={target_epsilon:g} cannot be reached in'
        f' {rounds} rounds of {clients_per_round} of {num_clients} clients:'
        f' the most noise TFF\'s DP aggregator takes with'
        f' {clients_per_round} clients per round (a multiplier just under'
        f' {bound:g}) still spends epsilon {best:.3g}. Sample more clients'
        ' per round (the bound grows by 0.1 a client), train fewer rounds,'
        ' or accept a larger epsilon.')
  low = high
  while epsilon(low, clients_per_round, num_clients, rounds,
                delta) <= target_epsilon:
    low /= 2  # Below the answer (epsilon grows without bound as z -> 0).
  # epsilon(low) > target >= epsilon(high).
  while high - low > NOISE_PRECISION * high:
    middle = (low + high) / 2
    if epsilon(middle, clients_per_round, num_clients, rounds,
               delta) <= target_epsilon:
      high = middle
    else:
      low = middle
  return high
