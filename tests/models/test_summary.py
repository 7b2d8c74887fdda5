import re

import keras
import numpy as np
import pytest

import bnn
from bnn import models
from bnn.models.summary import (LayerRow, compression_ratio, format_table, model_row, summarize,
                                totals)


def tiny_model():
    return keras.Sequential([
        keras.Input((6, 6, 3)),
        bnn.BinaryConv2D(4, 3, name="conv"),  # binary inputs and kernel
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Flatten(name="flat"),
        bnn.BinaryDense(5, input_quantizer=None, use_bias=True, name="dense"),  # real inputs
    ])


def test_rows_match_hand_computed_counts():
    rows = {r.name: r for r in summarize(tiny_model())}
    # conv: kernel 3*3*3*4 = 108 one-bit weights; output 4x4x4; MACs 4*4*108 = 1728, all 1-bit
    assert rows["conv"] == LayerRow("conv", "BinaryConv2D", 1, (None, 4, 4, 4),
                                    ((1, 108, True),), ((1, 1728),))
    # bn: gamma and beta fold into the moving variance and mean: 2 numbers per channel
    assert rows["bn"] == LayerRow("bn", "BatchNormalization", None, (None, 4, 4, 4),
                                  ((32, 4, False), (32, 4, False)), ())
    assert rows["flat"].weights == () and rows["flat"].macs == ()
    # dense: kernel 64*5 = 320 bits, bias 5 floats; real inputs, so its 320 MACs are 32-bit
    assert rows["dense"] == LayerRow("dense", "BinaryDense", None, (None, 5),
                                     ((1, 320, True), (32, 5, True)), ((32, 320),))
    assert rows["dense"].memory_bits == 320 + 5 * 32
    assert rows["dense"].memory_kib == pytest.approx((320 + 5 * 32) / 8 / 1024)


def test_totals_and_compression_ratio():
    rows = summarize(tiny_model())
    total = totals(rows)
    assert (total.params(1), total.params(32), total.params()) == (428, 13, 441)
    assert (total.params(trainable=True), total.params(trainable=False)) == (433, 8)
    assert (total.mac_count(1), total.mac_count(32), total.mac_count()) == (1728, 320, 2048)
    assert total.memory_bits == 428 + 13 * 32
    assert total.int8_bits == 428 + 13 * 8
    assert compression_ratio(rows) == pytest.approx(32 * 441 / (428 + 13 * 32))


def test_float_twin_has_no_quantized_params_and_ratio_one():
    rows = summarize(models.binarynet_mlp("float", input_shape=(8, 8), hidden_units=(16,)))
    total = totals(rows)
    assert total.param_bits == [32] and total.mac_bits == [32]
    assert all(r.input_bits is None for r in rows)
    assert total.mac_count() == 64 * 16 + 16 * 10
    assert compression_ratio(rows) == pytest.approx(1.0)


def test_format_table_lists_every_layer_totals_and_ratio():
    text = format_table(summarize(tiny_model()))
    lines = text.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "Layer", "Type", "Output shape", "1-bit params", "32-bit params", "Memory (KiB)",
        "1-bit MACs", "32-bit MACs"]
    assert [line.split()[0] for line in lines[2:6]] == ["conv", "bn", "flat", "dense"]
    assert lines[-2].split() == ["total", "428", "13", "0.10", "1,728", "320"]
    assert lines[-1] == f"Compression ratio vs float32: {32 * 441 / 844:.2f}x"
    assert len({len(line) for line in lines[:2]}) == 1  # header as wide as the rule
    without_macs = format_table(summarize(tiny_model()), include_macs=False)
    assert "MACs" not in without_macs
    assert without_macs.splitlines()[-2].split() == ["total", "428", "13", "0.10"]


def test_summarize_rejects_unbuilt_model():
    with pytest.raises(ValueError, match="not built.*model.build"):
        summarize(keras.Sequential([bnn.BinaryDense(3)]))


def test_depthwise_and_separable_layers_count_both_halves_at_the_input_precision():
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        bnn.layers.BinaryDepthwiseConv2D(3, depth_multiplier=2, name="dw"),
        bnn.layers.BinarySeparableConv2D(5, 3, name="sep"),
    ])
    dw, sep = summarize(model)
    assert (dw.params(1), dw.params(32)) == (3 * 3 * 3 * 2, 0)
    assert dw.macs == ((1, 6 * 6 * 3 * 3 * 3 * 2),)
    assert sep.params(1) == 3 * 3 * 6 + 6 * 5
    # both kernels are binary and the layer's inputs are binarized: 1-bit MACs, as Larq counts
    assert sep.macs == ((1, 4 * 4 * 3 * 3 * 6), (1, 4 * 4 * 6 * 5))


def test_multibit_kernels_count_at_their_precision_and_macs_at_the_wider_operand():
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        bnn.BinaryConv2D(3, 3, kernel_quantizer="ste_tern", name="tern"),
        bnn.BinaryConv2D(4, 1, kernel_quantizer=bnn.quantizers.DoReFa(4, "weights"),
                         name="dorefa4"),
        bnn.BinaryConv2D(4, 1, input_quantizer=bnn.quantizers.DoReFa(8),
                         kernel_quantizer=bnn.quantizers.NoOp(1), name="noop"),
    ])
    tern, dorefa, noop = summarize(model)
    assert tern.weights == ((2, 54, True),) and tern.memory_bits == 2 * 54
    assert tern.macs == ((2, 16 * 54),)  # 1-bit inputs, 2-bit kernel
    assert dorefa.weights == ((4, 12, True),) and dorefa.macs == ((4, 16 * 12),)
    assert noop.input_bits == 8 and noop.macs == ((8, 16 * 16),)
    total = totals([tern, dorefa, noop])
    assert total.param_bits == [1, 2, 4] and total.mac_bits == [2, 4, 8]
    assert compression_ratio([tern]) == pytest.approx(16.0)


@pytest.mark.parametrize("kwargs", [{}, {"scale": False}, {"center": False},
                                    {"center": False, "scale": False}])
def test_batch_normalization_counts_two_non_trainable_numbers_per_channel(kwargs):
    model = keras.Sequential([keras.Input((7,)), keras.layers.BatchNormalization(**kwargs)])
    (row,) = summarize(model)
    assert row.weights == ((32, 7, False), (32, 7, False))


def test_layers_whose_work_is_not_counted_have_no_macs():
    model = keras.Sequential([keras.Input((4, 4, 2)), keras.layers.Activation("relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    act, gap, dense = summarize(model)
    assert act.macs is None and gap.macs is None and dense.macs == ((32, 6),)
    assert totals([act, gap, dense]).mac_count() == 6
    lines = format_table([act, gap, dense]).splitlines()
    assert lines[2].split()[-1] == "?" and lines[-2].split()[-1] == "6"


def test_a_nested_model_is_one_row_or_its_layers():
    inner = keras.Sequential([keras.Input((4,)), bnn.BinaryDense(3, name="a"),
                              keras.layers.BatchNormalization(name="b")], name="inner")
    outer = keras.Sequential([keras.Input((2, 2)), keras.layers.Flatten(name="f"), inner,
                              keras.layers.Dense(2, name="c")])
    assert [r.name for r in summarize(outer)] == ["f", "a", "b", "c"]
    nested = summarize(outer, flatten=False)
    assert [r.name for r in nested] == ["f", "inner", "c"]
    assert nested[1] == model_row(inner)
    assert nested[1].input_bits == 1 and nested[1].output_shape == (None, 3)
    assert nested[1].weights == ((1, 12, True), (32, 3, False), (32, 3, False))
    assert nested[1].macs == ((1, 12),)
    assert totals(nested).weights == totals(summarize(outer)).weights


def test_a_layer_called_with_different_output_shapes_has_none():
    a, b = keras.Input((8,)), keras.Input((3, 8))
    dense = keras.layers.Dense(5, name="shared")
    model = keras.Model([a, b], [dense(a), keras.layers.Dense(2, name="after")(dense(b))])
    (row,) = [r for r in summarize(model) if r.name == "shared"]
    assert row.output_shape is None and row.macs is None
    (line,) = [ln for ln in format_table(summarize(model)).splitlines() if ln.startswith("shared")]
    assert line.split()[2] == "?" and line.split()[-1] == "?"  # shape and MACs unknown


def test_a_subclassed_model_built_from_a_shape_has_its_layers_counted():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = bnn.BinaryDense(4, name="d")

        def call(self, x):
            return self.dense(x)

    net = Net()
    net.build((None, 6))  # Keras 3 marks the model built without building its layers
    (row,) = summarize(net)
    assert row.weights == ((1, 24, True),)
    assert row.output_shape is None and row.macs is None  # never called on a keras.Input
    assert net(np.zeros((2, 6), "float32")).shape == (2, 4)
