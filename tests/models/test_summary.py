import keras
import pytest

import bnn
from bnn import models
from bnn.models.summary import LayerRow, compression_ratio, format_table, summarize, totals


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
    # conv: kernel 3*3*3*4 = 108 bits; output 4x4x4; MACs 4*4*108 = 1728, all xor-popcount
    assert rows["conv"] == LayerRow("conv", "BinaryConv2D", "(None, 4, 4, 4)", 108, 0,
                                    108 / 8 / 1024, 1728, 0)
    # bn: gamma, beta, moving mean and variance for 4 channels, all float
    assert rows["bn"] == LayerRow("bn", "BatchNormalization", "(None, 4, 4, 4)", 0, 16,
                                  16 * 32 / 8 / 1024, 0, 0)
    assert (rows["flat"].binary_params, rows["flat"].float_params) == (0, 0)
    # dense: kernel 64*5 = 320 bits, bias 5 floats; real inputs, so its 320 MACs are float
    assert rows["dense"] == LayerRow("dense", "BinaryDense", "(None, 5)", 320, 5,
                                     (320 + 5 * 32) / 8 / 1024, 0, 320)


def test_totals_and_compression_ratio():
    rows = summarize(tiny_model())
    total = totals(rows)
    assert (total.binary_params, total.float_params) == (428, 21)
    assert (total.binary_macs, total.float_macs) == (1728, 320)
    assert total.memory_kib == pytest.approx((428 + 21 * 32) / 8 / 1024)
    assert compression_ratio(rows) == pytest.approx(32 * 449 / (428 + 21 * 32))


def test_float_twin_has_no_binary_params_and_ratio_one():
    rows = summarize(models.binarynet_mlp("float", input_shape=(8, 8), hidden_units=(16,)))
    assert totals(rows).binary_params == 0 and totals(rows).binary_macs == 0
    assert totals(rows).float_macs == 64 * 16 + 16 * 10
    assert compression_ratio(rows) == pytest.approx(1.0)


def test_format_table_lists_every_layer_totals_and_ratio():
    text = format_table(summarize(tiny_model()))
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["Layer", "Type"]
    assert [line.split()[0] for line in lines[2:6]] == ["conv", "bn", "flat", "dense"]
    assert lines[-2].split() == ["total", "428", "21", "0.13", "1,728", "320"]
    assert lines[-1] == "Compression ratio vs float32: 13.06x"
    assert len({len(line) for line in lines[:2]}) == 1  # header as wide as the rule


def test_summarize_rejects_unbuilt_model():
    with pytest.raises(ValueError, match="not built"):
        summarize(keras.Sequential([bnn.BinaryDense(3)]))


def test_depthwise_and_separable_layers_count_binary_params_and_macs():
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        bnn.layers.BinaryDepthwiseConv2D(3, depth_multiplier=2, name="dw"),
        bnn.layers.BinarySeparableConv2D(5, 3, name="sep"),
    ])
    dw, sep = summarize(model)
    assert (dw.binary_params, dw.float_params) == (3 * 3 * 3 * 2, 0)
    assert dw.binary_macs == 6 * 6 * 3 * 3 * 3 * 2 and dw.float_macs == 0
    assert sep.binary_params == 3 * 3 * 6 + 6 * 5
    # the depthwise half is binary (quantized inputs); the pointwise half sees real values
    assert sep.binary_macs == 4 * 4 * 3 * 3 * 6 and sep.float_macs == 4 * 4 * 6 * 5
