"""The architectures' names (plain Python, so settings can list them).

`model_fns` builds the plain ones, `slimmable_models` the slimmable ones;
the run configuration checks `--model` against these without importing
TensorFlow.
"""

PLAIN_MODELS = ('lenet', 'cifar_cnn', 'ditto_cnn', 'fedavg_cnn', 'mlp',
                'text_cnn', 'char_lstm')
SLIMMABLE_MODELS = ('slimmable_lenet', 'slimmable_cifar_cnn',
                    'slimmable_ditto_cnn', 'slimmable_fedavg_cnn',
                    'slimmable_resnet18', 'slimmable_text_cnn')
MODELS = PLAIN_MODELS + SLIMMABLE_MODELS
