"""The algorithms a run can train: `--algorithm` name -> recipe.

Adding an algorithm adds one line to `RECIPES` (see `recipe.py`). The
registry also builds a run's complete configuration from flat settings
(`make_config`): shared ones, and the chosen algorithm's own.
"""

from collections.abc import Iterator
import dataclasses
from typing import Any

from tff_fair.models import names as model_names
from tff_fair.training import config as config_lib
from tff_fair.training.recipes import aequa
from tff_fair.training.recipes import aequa_rewards
from tff_fair.training.recipes import cfl
from tff_fair.training.recipes import cgsv
from tff_fair.training.recipes import ditto
from tff_fair.training.recipes import fedavg
from tff_fair.training.recipes import fedavg_ft
from tff_fair.training.recipes import feddf
from tff_fair.training.recipes import fedmd
from tff_fair.training.recipes import fedprox
from tff_fair.training.recipes import fedrep
from tff_fair.training.recipes import iafl
from tff_fair.training.recipes import per_fedavg
from tff_fair.training.recipes import pfedme
from tff_fair.training.recipes import recipe
from tff_fair.training.recipes import standalone

RECIPES: dict[str, type[recipe.Recipe]] = {r.name: r for r in (
    fedavg.FedAvg,
    fedavg_ft.FedAvgFineTuning,
    standalone.Standalone,
    ditto.Ditto,
    aequa.Aequa,
    fedprox.FedProx,
    aequa_rewards.AequaRewards,
    cgsv.Cgsv,
    iafl.Iafl,
    per_fedavg.PerFedAvg,
    fedrep.FedRep,
    pfedme.PFedMe,
    cfl.Cfl,
    feddf.FedDF,
    fedmd.FedMD,
)}
DEFAULT_ALGORITHM = 'fedavg'
# Why an algorithm ignores a setting when its recipe does not say.
_IGNORED_BECAUSE = {
    'server_held_out_examples': 'it measures no model on common held-out'
                                ' data unless --common_test_evaluation is'
                                ' given',
    'public_examples': 'it shares no public data among its clients',
}


def names() -> tuple[str, ...]:
  """The `--algorithm` names, in registry order."""
  return tuple(RECIPES)


def get(name: str) -> type[recipe.Recipe]:
  """The recipe of `name`.

  Raises:
    config.ConfigError: For an unknown name, listing the known ones.
  """
  config_lib.check_choice('algorithm', name, names())
  return RECIPES[name]


def setting_fields() -> Iterator[tuple[dataclasses.Field, tuple[str, ...]]]:
  """Every algorithm's own setting once: (field, algorithms that read it).

  A name several recipes share must have one default and type.
  """
  owners: dict[str, list[str]] = {}
  fields: dict[str, dataclasses.Field] = {}
  for name, recipe_type in RECIPES.items():
    for field in dataclasses.fields(recipe_type.Settings):
      known = fields.setdefault(field.name, field)
      if (known.default, known.type) != (field.default, field.type):
        raise TypeError(
            f'Setting {field.name!r} has another default or type in'
            f' {name!r} than in {owners[field.name][0]!r}.')
      owners.setdefault(field.name, []).append(name)
  for name, field in fields.items():
    yield field, tuple(owners[name])


def make_config(**values: Any) -> config_lib.RunConfig:
  """A run's complete, checked configuration from flat settings.

  Args:
    **values: `RunConfig`'s shared settings, and any algorithm's own by
      name (as the flags and config.json hold them). `algorithm` defaults
      to `DEFAULT_ALGORITHM`.

  Returns:
    The `RunConfig`, its `settings` those of the chosen algorithm, resolved
    (`Recipe.check_config`).

  Raises:
    config.ConfigError: For a bad value, for settings that disagree, and
      for another algorithm's setting given a value other than its default
      (it would be ignored). Each message names the setting.
  """
  name = values.pop('algorithm', '') or DEFAULT_ALGORITHM
  recipe_type = get(name)
  own_names = {f.name for f in dataclasses.fields(recipe_type.Settings)}
  others = {field.name: (field.default, owners)
            for field, owners in setting_fields()
            if field.name not in own_names}
  own = {k: values.pop(k) for k in list(values) if k in own_names}
  foreign = {k: values.pop(k) for k in list(values) if k in others}
  config = config_lib.RunConfig(
      algorithm=name, settings=recipe_type.Settings(**own), **values)
  if config.model in model_names.SLIMMABLE_MODELS and not recipe_type.slimmable:
    slimmable = [n for n, r in RECIPES.items() if r.slimmable]
    raise config_lib.ConfigError(
        f'--model={config.model} is a slimmable architecture for'
        f' --algorithm={" or ".join(slimmable)}; with --algorithm={name}'
        f' choose one of {", ".join(model_names.PLAIN_MODELS)}.')
  config = recipe_type.check_config(config)
  for key, value in foreign.items():
    default, owners = others[key]
    if value != default:
      raise config_lib.ConfigError(
          f'--{key}={value} is a setting of --algorithm={" or ".join(owners)},'
          f' which --algorithm={name} ignores; drop --{key} or use'
          f' --algorithm={owners[0]}.')
  unread = config_lib.unread_settings(config,
                                      recipe_type.settings_read(config))
  if unread:
    raise config_lib.ConfigError(unread_message(config, unread[0]))
  return config


def readers(setting: str, value: Any = None) -> list[str]:
  """The algorithms that read a shared setting (at `value`, if given).

  From the recipes' declared `reads`, in registry order.
  """
  return [name for name, r in RECIPES.items() if setting in r.reads and (
      value is None or config_lib.reads_value(r.reads, setting, value))]


def ignored_by_help(setting: str) -> str:
  """What `--helpfull` adds to a shared flag: the algorithms ignoring it.

  '' when every algorithm reads every value of it.
  """
  ignoring = [n for n, r in RECIPES.items() if setting not in r.reads]
  parts = [f'Ignored (refused) by --algorithm={", ".join(ignoring)}.'
           ] if ignoring else []
  parts += [f'{n} reads only {" or ".join(map(str, r.reads[setting]))}.'
            for n, r in RECIPES.items() if r.reads.get(setting) is not None]
  return ' '.join(parts)


def unread_message(config: config_lib.RunConfig, setting: str) -> str:
  """One line: `setting` is ignored by the run's algorithm; what to do."""
  name = config.algorithm
  recipe_type = RECIPES[name]
  value = getattr(config, setting)
  values = recipe_type.settings_read(config).get(setting, ())
  why = recipe_type.ignored_because.get(
      setting, _IGNORED_BECAUSE.get(setting, 'it does not read it'))
  others = [n for n in readers(setting, value) if n != name]
  use = (f', or use --algorithm={others[0]}' if len(others) == 1 else
         f', or use one of --algorithm={", ".join(others)}' if others else '')
  if values:  # It reads some values of the setting, not this one.
    what = f'reads --{setting} only as {" or ".join(map(str, values))}'
    fix = f'Choose one of those{use}'
  else:
    what = f'ignores --{setting}'
    fix = f'Drop --{setting}{use}'
  return (f'--{setting}={value} would be ignored: --algorithm={name} {what}:'
          f' {why}. {fix}.')


def check_workers(algorithm: str, num_workers: int) -> None:
  """Refuses an algorithm that cannot run on `num_workers` remote workers.

  Raises:
    config.ConfigError: For several workers and a recipe whose round
      returns per-client values (`Recipe.runs_on_several_workers`).
  """
  if num_workers > 1 and not get(algorithm).runs_on_several_workers:
    able = [n for n, r in RECIPES.items() if r.runs_on_several_workers]
    raise config_lib.ConfigError(
        f'--algorithm={algorithm} cannot split its clients over'
        f' {num_workers} workers: its round returns each client\'s values'
        " (models or updates it keeps per client), which TFF's multi-worker"
        ' context cannot return. Run it on one worker (--workers=host:port)'
        ' or with --executor=local; on several workers run'
        f' {", ".join(able)}.')


def output_files() -> tuple[str, ...]:
  """Every recipe's own files in an output directory (for --start_over)."""
  return _every('output_files')


def client_state_dirs() -> tuple[str, ...]:
  """Every recipe's per-client state folders in an output directory."""
  return _every('client_state_dirs')


def _every(attribute: str) -> tuple[str, ...]:
  """The union of one tuple attribute over the recipes, in registry order."""
  return tuple(dict.fromkeys(
      name for r in RECIPES.values() for name in getattr(r, attribute)))
