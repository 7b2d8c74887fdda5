"""bnn.catalog, which config validation reads without TensorFlow, describes the real builders and
quantizer classes default for default."""

import inspect

import pytest

from bnn import catalog, layers, models, quantizers


def test_model_options_match_the_builders_signatures():
    assert catalog.model_names() == models.names()
    for name in models.names():
        assert catalog.MODEL_OPTIONS[name] == models.option_defaults(name), name


def test_quantizer_arguments_match_the_quantizer_classes():
    assert catalog.quantizer_names() == quantizers.names()
    for name in quantizers.names():
        parameters = inspect.signature(quantizers.get(name).__class__.__init__).parameters
        defaults = {k: p.default for k, p in parameters.items() if k != "self"}
        assert catalog.QUANTIZER_ARGUMENTS[name] == defaults, name
    for (name, argument), minimum in catalog.QUANTIZER_MINIMUMS.items():
        assert argument in catalog.QUANTIZER_ARGUMENTS[name]
        quantizers.get({"name": name, argument: minimum})  # the minimum itself is accepted
        with pytest.raises(ValueError):
            quantizers.get({"name": name, argument: minimum - 1})
    for (name, argument), words in catalog.QUANTIZER_CHOICES.items():
        for word in words:
            quantizers.get({"name": name, argument: word})
        with pytest.raises(ValueError):
            quantizers.get({"name": name, argument: "neither"})


def test_precisions_are_the_layers_precisions():
    assert catalog.PRECISIONS == layers.PRECISIONS
