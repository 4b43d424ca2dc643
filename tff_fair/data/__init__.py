"""Data layer: offline loaders, client partitions and TFF client data.

* `sources`: a loader module per data set; `load_source(name, ...)`
  (`sources.registry`) -> pooled `Source` arrays (`sources.source`).
* `partition`: index partitions (homogeneous, dirichlet, quantity_skew,
  label_skew, natural) and the `partition.partition(kind, ...)` dispatcher.
* `federated`: `build_federated_data(...)` -> `FederatedData` with per-client
  train/validation/test splits and `ClientData` views.

The dispatcher is deliberately not re-exported here: a package attribute
named `partition` must stay the submodule. The `federated` names are loaded
on first use so that `sources` and `partition` can be used without paying
for the TensorFlow / TFF import.
"""

import importlib
from typing import Any

from tff_fair.data.partition import dirichlet
from tff_fair.data.partition import homogeneous
from tff_fair.data.partition import label_skew
from tff_fair.data.partition import natural
from tff_fair.data.partition import PartitionError
from tff_fair.data.partition import PARTITIONS
from tff_fair.data.partition import quantity_skew
from tff_fair.data.sources.registry import load_source
from tff_fair.data.sources.registry import SOURCE_NAMES
from tff_fair.data.sources.source import DataError
from tff_fair.data.sources.source import OWN_SOURCE_NAME
from tff_fair.data.sources.source import Source

_LAZY_FEDERATED = (
    'build_federated_data',
    'ClientSplits',
    'FederatedData',
    'SPLITS',
)


def __getattr__(name: str) -> Any:
  if name in _LAZY_FEDERATED:
    return getattr(importlib.import_module('tff_fair.data.federated'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = [
    'DataError',
    'dirichlet',
    'homogeneous',
    'label_skew',
    'load_source',
    'natural',
    'OWN_SOURCE_NAME',
    'PartitionError',
    'PARTITIONS',
    'quantity_skew',
    'Source',
    'SOURCE_NAMES',
    *_LAZY_FEDERATED,
]
