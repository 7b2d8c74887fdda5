"""``lq.models.summary`` prints the tables Larq prints, for Larq's own example models.

``tests/larq/larq_summary_reference.py`` builds each example (Larq's tutorials and guides, the
models of Larq's tests, and a few that reach every counting rule) with Larq in Larq's own
environment and records what ``larq.models.summary`` prints; here the same source builds the
model with ``bnn.larq`` on Keras 3 and the printed tables must be the same, row for row and
column for column. Keras 3 differs only in names: its layers are named after bnn's classes
(``binary_conv2d`` for ``quant_conv2d``), its inputs ``input_layer``, ``input_layer_1`` ... and its
functional models ``functional`` (tf-keras: ``input_1``, ``model``), and it makes no layers for
TensorFlow functions called in a functional model (tf-keras' ``tf.split`` rows). Without Larq's
environment those tests skip, and the tutorials' tables as Larq's documentation publishes them
are the reference.
"""

import importlib.util
import json
import re

import keras
import pytest
import tensorflow as tf

import bnn.larq as lq
from bnn.larq import models as larq_models
from bnn.models import summary as counts
from support import ROOT, larq_script_output

SCRIPT = ROOT / "tests" / "larq" / "larq_summary_reference.py"
_spec = importlib.util.spec_from_file_location("larq_summary_reference", SCRIPT)
reference_sources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference_sources)  # the model sources only: it imports no Larq

#: The same models as Keras 3 must write them: a KerasTensor has no ``get_shape`` and TensorFlow
#: functions do not take one (``keras.ops`` does).
KERAS3_SOURCES = {
    "guide_shortcut_blocks": reference_sources.source("guide_shortcut_blocks").replace(
        "x.get_shape().as_list()[-1]", "x.shape[-1]"),
    "larq_test_functional_model": reference_sources.source("larq_test_functional_model")
    .replace("tf.split(", "keras.ops.split(").replace("tf.concat(", "keras.ops.concatenate("),
}
#: Rows of Larq's table that the Keras 3 model has no layer for.
KERAS3_ABSENT_ROWS = {"larq_test_functional_model": {"tf.split", "tf.concat"}}
#: Larq fails on these (the example's own quantizer declares no precision).
LARQ_FAILS = {"guide_custom_quantizers"}


def build(name: str) -> keras.Model:
    """The example model ``name`` built with bnn.larq, layer names counted from scratch."""
    keras.backend.clear_session()
    scope = {"tf": tf, "keras": keras, "lq": lq, "larq": lq}
    exec(KERAS3_SOURCES.get(name) or reference_sources.source(name), scope)
    return scope["model"]


def keras3_name(name: str) -> str:
    """The name Keras 3 gives the layer or model tf-keras names ``name``."""
    name = re.sub(r"^quant_", "binary_", name)
    number = re.fullmatch(r"input_(\d+)", name)
    if number:
        return "input_layer" + ("" if number[1] == "1" else f"_{int(number[1]) - 1}")
    return re.sub(r"^model(_\d+)?$", r"functional\1", name)


def printed(model: keras.Model, **kwargs) -> list[str]:
    out = []
    lq.models.summary(model, print_fn=out.append, **kwargs)
    return out


@pytest.fixture(scope="module")
def larq_summaries(request) -> dict:
    """Runs the reference script in Larq's environment; returns what it recorded. Cached in
    pytest's cache, keyed by the script and the Larq python (``pytest --cache-clear`` redoes
    it)."""
    out = larq_script_output(request, SCRIPT.name, "summaries.json") / "summaries.json"
    found = json.loads(out.read_text())
    assert found["larq"] == "0.14.0", found["larq"]
    return found


def as_keras3(case: dict, name: str, include_macs: bool = True) -> list[str]:
    """Larq's two tables for example ``name`` with Keras 3's names and without the rows Keras 3
    has no layer for, drawn by bnn's table writer (which draws Larq's own cells as Larq does:
    ``test_tables_are_drawn_as_larq_draws_them``)."""
    absent = KERAS3_ABSENT_ROWS.get(name, set())
    table = [[keras3_name(row[0]), *row[1:]] for row in case["table"] if row[0] not in absent]
    title = keras3_name(case["title"])
    summary = case["summary" if include_macs else "summary_without_macs"]
    return [larq_models.text_table(table, f"{title} stats", ruled=True),
            larq_models.text_table(summary, f"{title} summary", ruled=False)]


EXAMPLES = sorted(set(reference_sources.MODELS) - LARQ_FAILS)


@pytest.mark.parametrize("name", EXAMPLES)
def test_summary_prints_what_larq_prints_for_larqs_examples(larq_summaries, name):
    case = larq_summaries["cases"][name]
    assert "error" not in case, case.get("error")
    model = build(name)
    expected = as_keras3(case, name)
    assert printed(model) == expected
    if expected == case["printed"]:  # no name differs: Larq's own text
        assert printed(model) == case["printed"]
    # include_macs=False drops the MAC lines of the summary, not the table's MAC columns
    assert printed(model, include_macs=False) == as_keras3(case, name, include_macs=False)


def test_examples_reach_every_counting_rule(larq_summaries):
    """The examples are not all alike: together they have 1-, 2-, 4-, 8- and 32-bit MACs,
    1-, 2-, 4- and 32-bit parameters, uncounted layers, nested and subclassed models."""
    headers = {cell for case in larq_summaries["cases"].values() if "table" in case
               for cell in case["table"][0]}
    assert {"# 1-bit\nx 1", "# 2-bit\nx 1", "# 4-bit\nx 1", "# 32-bit\nx 1"} <= headers
    assert {"1-bit MACs", "2-bit MACs", "4-bit MACs", "8-bit MACs", "32-bit MACs"} <= headers
    cells = {cell for case in larq_summaries["cases"].values() if "table" in case
             for row in case["table"] for cell in row}
    assert {"?", "multiple", "sequential_1"} <= cells


def test_tables_are_drawn_as_larq_draws_them(larq_summaries):
    for name, case in larq_summaries["cases"].items():
        if name in LARQ_FAILS:
            continue
        drawn = [larq_models.text_table(case["table"], f"{case['title']} stats", ruled=True),
                 larq_models.text_table(case["summary"], f"{case['title']} summary",
                                        ruled=False)]
        assert drawn == case["printed"], name


def test_a_title_wider_than_the_table_is_left_out_as_larq_does(larq_summaries):
    case = larq_summaries["cases"]["larq_test_model_without_weights"]
    table = larq_models.text_table(case["summary"], "x" * 200, ruled=False)
    assert table.splitlines()[0] == "+" + "-" * (len(table.splitlines()[1]) - 2) + "+"


def test_counts_and_sizes_read_as_larq_writes_them(larq_summaries):
    for value, text in larq_summaries["numbers"]:
        assert larq_models.readable_count(value) == text, value
    for bits, text in larq_summaries["memory"]:
        assert larq_models.readable_memory(bits) == text, bits


def test_an_unbuilt_model_is_an_error_as_in_larq(larq_summaries):
    assert larq_summaries["errors"] == {"unbuilt_model": "ValueError",
                                        "unbuilt_sequential": "ValueError"}
    for model in (keras.Model(), keras.Sequential([lq.layers.QuantDense(3)])):
        with pytest.raises(ValueError) as error:
            lq.models.summary(model)
        message = str(error.value)
        assert "\n" not in message and "not built" in message and "model.build(" in message


def test_a_kernel_quantizer_without_precision_counts_at_32_bits(larq_summaries):
    # Larq 0.14 fails on its guide's custom quantizer (it has no precision to count the kernel
    # at); bnn counts that kernel, and the products with it, as 32-bit.
    assert larq_summaries["cases"]["guide_custom_quantizers"]["error"].startswith("TypeError")
    row = counts.summarize(build("guide_custom_quantizers"))[-1]
    assert row.input_bits is None
    assert row.weights == ((32, 640, True), (32, 10, True))
    assert row.macs == ((32, 640),)


# -- without Larq: the tables Larq's tutorials publish --------------------------------------------

#: ``lq.models.summary(model)`` in Larq's MNIST tutorial (docs.larq.dev/larq/tutorials/mnist).
PUBLISHED_MNIST = """\
+sequential stats------------------------------------------------------------------------------------------+
| Layer                  Input prec.           Outputs  # 1-bit  # 32-bit  Memory  1-bit MACs  32-bit MACs |
|                              (bit)                        x 1       x 1    (kB)                          |
+----------------------------------------------------------------------------------------------------------+
| quant_conv2d                     -  (-1, 26, 26, 32)      288         0    0.04           0       194688 |
| max_pooling2d                    -  (-1, 13, 13, 32)        0         0       0           0            0 |
| batch_normalization              -  (-1, 13, 13, 32)        0        64    0.25           0            0 |
| quant_conv2d_1                   1  (-1, 11, 11, 64)    18432         0    2.25     2230272            0 |
| max_pooling2d_1                  -    (-1, 5, 5, 64)        0         0       0           0            0 |
| batch_normalization_1            -    (-1, 5, 5, 64)        0       128    0.50           0            0 |
| quant_conv2d_2                   1    (-1, 3, 3, 64)    36864         0    4.50      331776            0 |
| batch_normalization_2            -    (-1, 3, 3, 64)        0       128    0.50           0            0 |
| flatten                          -         (-1, 576)        0         0       0           0            0 |
| quant_dense                      1          (-1, 64)    36864         0    4.50       36864            0 |
| batch_normalization_3            -          (-1, 64)        0       128    0.50           0            0 |
| quant_dense_1                    1          (-1, 10)      640         0    0.08         640            0 |
| batch_normalization_4            -          (-1, 10)        0        20    0.08           0            0 |
| activation                       -          (-1, 10)        0         0       0           ?            ? |
+----------------------------------------------------------------------------------------------------------+
| Total                                                   93088       468   13.19     2599552       194688 |
+----------------------------------------------------------------------------------------------------------+
+sequential summary----------------------------+
| Total params                      93.6 k     |
| Trainable params                  93.1 k     |
| Non-trainable params              468        |
| Model size                        13.19 KiB  |
| Model size (8-bit FP weights)     11.82 KiB  |
| Float-32 Equivalent               365.45 KiB |
| Compression Ratio of Memory       0.04       |
| Number of MACs                    2.79 M     |
| Ratio of MACs that are binarized  0.9303     |
+----------------------------------------------+
"""
#: ``lq.models.summary(model)`` in Larq's BinaryNet CIFAR-10 tutorial
#: (docs.larq.dev/larq/tutorials/binarynet_cifar10).
PUBLISHED_BINARYNET_CIFAR10 = """\
+sequential stats---------------------------------------------------------------------------------------------+
| Layer                  Input prec.            Outputs   # 1-bit  # 32-bit   Memory  1-bit MACs  32-bit MACs |
|                              (bit)                          x 1       x 1     (kB)                          |
+-------------------------------------------------------------------------------------------------------------+
| quant_conv2d                     -  (-1, 30, 30, 128)      3456         0     0.42           0      3110400 |
| batch_normalization              -  (-1, 30, 30, 128)         0       256     1.00           0            0 |
| quant_conv2d_1                   1  (-1, 30, 30, 128)    147456         0    18.00   132710400            0 |
| max_pooling2d                    -  (-1, 15, 15, 128)         0         0        0           0            0 |
| batch_normalization_1            -  (-1, 15, 15, 128)         0       256     1.00           0            0 |
| quant_conv2d_2                   1  (-1, 15, 15, 256)    294912         0    36.00    66355200            0 |
| batch_normalization_2            -  (-1, 15, 15, 256)         0       512     2.00           0            0 |
| quant_conv2d_3                   1  (-1, 15, 15, 256)    589824         0    72.00   132710400            0 |
| max_pooling2d_1                  -    (-1, 7, 7, 256)         0         0        0           0            0 |
| batch_normalization_3            -    (-1, 7, 7, 256)         0       512     2.00           0            0 |
| quant_conv2d_4                   1    (-1, 7, 7, 512)   1179648         0   144.00    57802752            0 |
| batch_normalization_4            -    (-1, 7, 7, 512)         0      1024     4.00           0            0 |
| quant_conv2d_5                   1    (-1, 7, 7, 512)   2359296         0   288.00   115605504            0 |
| max_pooling2d_2                  -    (-1, 3, 3, 512)         0         0        0           0            0 |
| batch_normalization_5            -    (-1, 3, 3, 512)         0      1024     4.00           0            0 |
| flatten                          -         (-1, 4608)         0         0        0           0            0 |
| quant_dense                      1         (-1, 1024)   4718592         0   576.00     4718592            0 |
| batch_normalization_6            -         (-1, 1024)         0      2048     8.00           0            0 |
| quant_dense_1                    1         (-1, 1024)   1048576         0   128.00     1048576            0 |
| batch_normalization_7            -         (-1, 1024)         0      2048     8.00           0            0 |
| quant_dense_2                    1           (-1, 10)     10240         0     1.25       10240            0 |
| batch_normalization_8            -           (-1, 10)         0        20     0.08           0            0 |
| activation                       -           (-1, 10)         0         0        0           ?            ? |
+-------------------------------------------------------------------------------------------------------------+
| Total                                                  10352000      7700  1293.75   510961664      3110400 |
+-------------------------------------------------------------------------------------------------------------+
+sequential summary---------------------------+
| Total params                      10.4 M    |
| Trainable params                  10.4 M    |
| Non-trainable params              7.7 k     |
| Model size                        1.26 MiB  |
| Model size (8-bit FP weights)     1.24 MiB  |
| Float-32 Equivalent               39.52 MiB |
| Compression Ratio of Memory       0.03      |
| Number of MACs                    514 M     |
| Ratio of MACs that are binarized  0.9939    |
+---------------------------------------------+
"""


def with_bnn_layer_names(text: str) -> str:
    """``text`` with Keras 3's names for Larq's layers: ``binary_conv2d`` one character longer
    than ``quant_conv2d``, taken from the padding of the left-aligned name column."""
    return re.sub(r"quant_(\S+) ", r"binary_\1", text)


@pytest.mark.parametrize("name, published", [("mnist_tutorial", PUBLISHED_MNIST),
                                             ("binarynet_cifar10", PUBLISHED_BINARYNET_CIFAR10)])
def test_summary_prints_the_tables_larqs_tutorials_publish(name, published):
    assert "\n".join(printed(build(name))) + "\n" == with_bnn_layer_names(published)


def test_the_binarynet_tutorial_counts_batch_norm_as_two_folded_numbers_per_channel():
    # Larq's published totals: 10,352,000 1-bit and 7,700 32-bit parameters (BatchNormalization
    # with scale=False on 7,700 / 2 channels), 510,961,664 1-bit and 3,110,400 32-bit MACs,
    # 99.39% binary.
    total = counts.totals(counts.summarize(build("binarynet_cifar10")))
    assert (total.params(1), total.params(32), total.params(trainable=False)) == (
        10_352_000, 7_700, 7_700)
    assert (total.mac_count(1), total.mac_count(32)) == (510_961_664, 3_110_400)
    assert total.mac_count(1) / total.mac_count() == pytest.approx(0.9939, abs=5e-5)


def test_summary_prints_through_print_fn_or_print(capsys):
    model = build("mnist_tutorial")
    lq.models.summary(model)
    assert capsys.readouterr().out == "\n".join(printed(model)) + "\n"
    assert len(printed(model)) == 2
