"""Loaders that turn the offline benchmark files into pooled `Source` arrays.

One module per data set, each with its `load_<name>` function:
`fashion_mnist`, `mnist`, `cifar10`, `femnist`, `shakespeare`, `sst2`,
`digits`, and `tfds_loader` for the TensorFlow Datasets route. What they
share has its own module:

* `source`: the `Source` type (one data set pooled in memory), `DataError`,
  the dtype conventions and the deterministic subset (`max_examples`).
* `registry`: `load_source(name, ...)`, the names (`SOURCE_NAMES`) and the
  loader of each.
* `paths`: where the files are looked up (`data_dir`, `TFF_FAIR_DATA_DIR`).
* `cache`: decoded arrays cached on disk (CIFAR-10's JPEGs).
* `tokenizers`: Shakespeare's character ids and SST-2's word ids.
* `idx`: the IDX format of (Fashion-)MNIST.

Loaders never split or shuffle: partitioning into clients happens later
(`tff_fair.data.partition`, `tff_fair.data.federated`). The public names are
re-exported by `tff_fair.data` (`load_source`, `Source`, `SOURCE_NAMES`,
`DataError`, `OWN_SOURCE_NAME`).
"""
