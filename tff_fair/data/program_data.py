"""Client data for `tff.program` drivers such as `train_model`.

`tff.learning.programs.train_model` deep-copies its data-source iterator
every round, and TFF 0.87's `tff.program.DatasetDataSourceIterator` cannot
be deep-copied under TF 2.14: its `tf.data.Dataset`s hold a graph. These
drop-in replacements share the (immutable) data sets between copies and
otherwise behave exactly as TFF's.
"""

import tensorflow_federated as tff


class DatasetDataSourceIterator(tff.program.DatasetDataSourceIterator):
  """TFF's iterator whose deep copies share its data sets."""

  def __deepcopy__(self, memo) -> 'DatasetDataSourceIterator':
    del memo  # Data sets are immutable: nothing to copy.
    return DatasetDataSourceIterator(self._datasets, self.federated_type)


class DatasetDataSource(tff.program.DatasetDataSource):
  """`tff.program.DatasetDataSource` that `train_model` can iterate."""

  def iterator(self) -> DatasetDataSourceIterator:
    return DatasetDataSourceIterator(self._datasets, self.federated_type)
