import dataclasses
import os
import re
import textwrap

import pytest
import yaml

from bnn import models
from bnn.train.config import (
    Config,
    ConfigError,
    DatasetConfig,
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainingConfig,
    apply_override,
    dump_config,
    hparams,
    load_config,
    parse_config,
    to_dict,
)
from support import ROOT

FULL = """\
name: cifar_vgg
dataset:
  name: cifar10
  validation_split: 0.1
  augment: false
  limit_train: 5000
  limit_test: 1000
model:
  name: vgg_small
  options:
    filters: [64, 64, 128, 128, 256, 256]
    dense_units: [512, 512]
    kernel_quantizer: {name: ste_sign, clip_value: 1.5}
    input_quantizer: approx_sign
    momentum: 0.99
optimizer:
  name: sgd
  learning_rate: 1e-2        # YAML 1.1 reads this as a string
  momentum: 0.95
  nesterov: true
  weight_decay: 5e-4
schedule:
  name: exponential
  final_learning_rate: 3e-6
  warmup_epochs: 2
training:
  epochs: 150
  batch_size: 50
  seed: 7
  loss: squared_hinge
  label_smoothing: 0.1
  device: gpu
  xla: false
  mixed_precision: bfloat16
  distribute: mirrored
  checkpoints_keep: 5
  deterministic: true
  histogram_freq: 0
output_dir: /tmp/runs/vgg
"""


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text))
    return path


def test_full_config_loads_with_the_right_types_and_values(tmp_path):
    path = write(tmp_path, FULL)
    config = load_config(path)
    assert config.name == "cifar_vgg"
    assert config.source == str(path)
    assert config.output_dir == "/tmp/runs/vgg"
    assert config.dataset == DatasetConfig("cifar10", 0.1, False, 5000, 1000)
    assert config.model.name == "vgg_small"
    assert config.model.options["filters"] == [64, 64, 128, 128, 256, 256]
    assert config.model.options["kernel_quantizer"] == {"name": "ste_sign", "clip_value": 1.5}
    opt = config.optimizer
    assert (opt.name, opt.momentum, opt.nesterov) == ("sgd", 0.95, True)
    assert type(opt.learning_rate) is float and opt.learning_rate == 1e-2
    assert type(opt.weight_decay) is float and opt.weight_decay == 5e-4
    assert config.schedule.final_learning_rate == 3e-6 and config.schedule.warmup_epochs == 2
    t = config.training
    assert (t.epochs, t.batch_size, t.seed, t.loss) == (150, 50, 7, "squared_hinge")
    assert (t.device, t.xla, t.mixed_precision, t.distribute) == ("gpu", False, "bfloat16",
                                                                  "mirrored")
    assert (t.checkpoints_keep, t.deterministic, t.histogram_freq) == (5, True, 0)
    assert type(t.label_smoothing) is float


def test_defaults_fill_in_and_name_comes_from_the_file_stem(tmp_path):
    config = load_config(write(tmp_path, "training: {epochs: 2}\n", name="quick-mlp.yaml"))
    assert config.name == "quick-mlp"
    assert config.output_dir == "runs/quick-mlp"
    assert config.training == TrainingConfig(epochs=2)
    assert config.dataset == DatasetConfig()
    assert config.model == ModelConfig()
    assert config.optimizer == OptimizerConfig()
    assert config.schedule == ScheduleConfig()
    assert ModelConfig().options == {} and ModelConfig().options is not ModelConfig().options


def test_empty_sections_mean_defaults():
    config = parse_config({"training": None, "model": {"options": None}})
    assert config.training == TrainingConfig() and config.model.options == {}
    assert config.name == "experiment"


def test_config_built_in_code_gets_the_default_output_dir():
    assert Config(name="abc").output_dir == "runs/abc"
    assert Config(name="abc", output_dir="elsewhere").output_dir == "elsewhere"


def test_yaml_off_for_mixed_precision_means_off():
    assert parse_config({"training": {"mixed_precision": False}}).training.mixed_precision == "off"
    assert yaml.safe_load("m: off")["m"] is False  # why the rule above exists


def test_numeric_strings_count_as_floats_but_not_as_ints():
    config = parse_config({"optimizer": {"learning_rate": "3e-4", "epsilon": "1E-8"},
                           "model": {"options": {"dropout": "2e-1"}}})
    assert config.optimizer.learning_rate == 3e-4 and config.optimizer.epsilon == 1e-8
    assert config.model.options["dropout"] == 0.2
    with pytest.raises(ConfigError, match=r"training\.epochs"):
        parse_config({"training": {"epochs": "1e3"}})


def test_to_dict_round_trips_through_parse_config(tmp_path):
    config = load_config(write(tmp_path, FULL))
    data = to_dict(config)
    assert "source" not in data
    assert parse_config(data, source=config.source) == config
    assert parse_config(yaml.safe_load(yaml.safe_dump(data)), source=config.source) == config


def test_dump_config_writes_yaml_that_loads_back(tmp_path):
    config = load_config(write(tmp_path, FULL))
    out = tmp_path / "run" / "nested" / "config.yaml"
    dump_config(config, out)
    again = load_config(out)
    assert again == dataclasses.replace(config, source=str(out))


def test_overrides_set_nested_values_lists_bools_and_mappings(tmp_path):
    path = write(tmp_path, "training: {epochs: 100, xla: true}\n")
    config = load_config(path, overrides=[
        "training.epochs=3",
        "training.xla=false",
        "model.options.hidden_units=[256, 256]",
        "model.options.kernel_quantizer={name: ste_sign, clip_value: 2}",
        "optimizer.learning_rate=1e-4",
        "dataset.limit_train=512",
        "name=smoke",
    ])
    assert config.training.epochs == 3 and config.training.xla is False
    assert config.model.options == {"hidden_units": [256, 256],
                                    "kernel_quantizer": {"name": "ste_sign", "clip_value": 2}}
    assert config.optimizer.learning_rate == 1e-4
    assert config.dataset.limit_train == 512
    assert (config.name, config.output_dir) == ("smoke", "runs/smoke")


def test_later_override_wins_and_input_is_not_mutated():
    data = {"training": {"epochs": 5}}
    config = parse_config(data, overrides=["training.epochs=3", "training.epochs=4"])
    assert config.training.epochs == 4
    assert data == {"training": {"epochs": 5}}


def test_apply_override_edits_raw_data_in_place():
    data = {"model": {"options": None}}
    apply_override(data, "model.options.kernel_quantizer.clip_value=0.5", "f.yaml")
    assert data == {"model": {"options": {"kernel_quantizer": {"clip_value": 0.5}}}}
    apply_override(data, "training.mixed_precision = float16", "f.yaml")
    assert data["training"] == {"mixed_precision": "float16"}


def test_every_model_validates_and_reports_all_its_options_as_hparams(tmp_path):
    saved = tmp_path / "m.keras"
    saved.write_bytes(b"")  # keras_file needs a file to point at; it is read only when built
    for name in models.names():
        options = {"path": str(saved)} if name == "keras_file" else {}
        config = parse_config({"model": {"name": name, "options": options}})
        flat = hparams(config)
        assert {k.split(".", 2)[2] for k in flat if k.startswith("model.options.")} == set(
            models.option_names(name)) - {"input_shape", "num_classes"}


def test_hparams_are_flat_scalars_with_options_merged_over_defaults():
    config = parse_config({"model": {"options": {"hidden_units": [64]}},
                           "dataset": {"limit_test": 10}})
    flat = hparams(config)
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
    assert flat["training.epochs"] == 10 and flat["optimizer.learning_rate"] == 1e-3
    assert flat["model.options.hidden_units"] == "[64]"
    assert "model.options.input_shape" not in flat  # comes from the dataset, not the builder
    explicit = hparams(parse_config({"model": {"options": {"input_shape": [8, 8, 1]}}}))
    assert explicit["model.options.input_shape"] == "[8, 8, 1]"
    assert flat["model.options.kernel_quantizer"] == "ste_sign"
    assert flat["dataset.limit_test"] == 10 and "dataset.limit_train" not in flat
    assert "schedule.final_learning_rate" not in flat


def test_config_error_carries_its_parts():
    with pytest.raises(ConfigError) as info:
        parse_config({"training": {"batch_size": 0}}, source="a.yaml")
    error = info.value
    assert (error.source, error.key) == ("a.yaml", "training.batch_size")
    assert str(error) == f"a.yaml: training.batch_size: {error.problem}; {error.hint}"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_unreadable_file(tmp_path):
    path = write(tmp_path, "training: {epochs: 1}\n")
    path.chmod(0)
    with pytest.raises(ConfigError, match="permission denied"):
        load_config(path)


MISSING, DIRECTORY = object(), object()

# (id, file text (or MISSING / DIRECTORY), overrides, fragments the one-line message must contain)
BAD = [
    ("unknown_top_level_key", "trainig: {epochs: 3}", [], ["trainig", "did you mean 'training'"]),
    ("unknown_nested_key_suggests", "training: {epoch: 3}", [],
     ["training.epoch", "unknown key", "did you mean 'epochs'", "known keys"]),
    ("non_string_key", "training: {1: 2}", [], ["training.1", "not a name"]),
    ("section_not_mapping", "training: 5", [], ["training", "5 (int)", "mapping"]),
    ("options_not_mapping", "model: {options: [1]}", [], ["model.options", "[1]"]),
    ("string_for_int", "training: {epochs: ten}", [], ["training.epochs", "'ten'"]),
    ("quoted_number_for_int", "training: {epochs: '10'}", [], ["training.epochs", "'10'"]),
    ("float_for_int", "training: {epochs: 10.5}", [], ["training.epochs", "10.5"]),
    ("bool_for_int", "training: {batch_size: true}", [], ["training.batch_size", "True (bool)"]),
    ("list_for_float", "optimizer: {learning_rate: [0.1]}", [],
     ["optimizer.learning_rate", "[0.1] (list)"]),
    ("word_for_float", "optimizer: {learning_rate: fast}", [], ["optimizer.learning_rate", "'fast'"]),
    ("nan_for_float", "optimizer: {learning_rate: .nan}", [], ["optimizer.learning_rate", "nan"]),
    ("string_for_bool", "training: {xla: 'yes please'}", [], ["training.xla", "'yes please'"]),
    ("epochs_zero", "training: {epochs: 0}", [], ["training.epochs", "got 0", ">= 1"]),
    ("epochs_negative", "training: {epochs: -5}", [], ["training.epochs", "-5"]),
    ("batch_size_zero", "training: {batch_size: 0}", [], ["training.batch_size", "got 0"]),
    ("batch_size_negative", "training: {batch_size: -32}", [], ["training.batch_size", "-32"]),
    ("learning_rate_zero", "optimizer: {learning_rate: 0}", [],
     ["optimizer.learning_rate", "0 is out of range", "(0, inf)"]),
    ("learning_rate_negative", "optimizer: {learning_rate: -1e-3}", [],
     ["optimizer.learning_rate", "-0.001"]),
    ("seed_negative", "training: {seed: -1}", [], ["training.seed", "-1"]),
    ("validation_split_one", "dataset: {validation_split: 1.0}", [],
     ["dataset.validation_split", "1 is out of range", "[0, 1)"]),
    ("validation_split_negative", "dataset: {validation_split: -0.1}", [],
     ["dataset.validation_split", "-0.1"]),
    ("limit_train_zero", "dataset: {limit_train: 0}", [], ["dataset.limit_train", "got 0"]),
    ("label_smoothing_one", "training: {label_smoothing: 1.0}", [],
     ["training.label_smoothing", "1 is out of range"]),
    ("checkpoints_keep_zero", "training: {checkpoints_keep: 0}", [],
     ["training.checkpoints_keep", "got 0"]),
    ("histogram_freq_negative", "training: {histogram_freq: -1}", [],
     ["training.histogram_freq", "-1"]),
    ("momentum_one", "optimizer: {name: sgd, momentum: 1}", [], ["optimizer.momentum", "1 is out"]),
    ("beta_2_one", "optimizer: {beta_2: 1.0}", [], ["optimizer.beta_2", "1 is out"]),
    ("bop_gamma_zero", "optimizer: {name: bop, gamma: 0}", [], ["optimizer.gamma", "0 is out"]),
    ("bop_threshold_negative", "optimizer: {name: bop, threshold: -1e-8}", [],
     ["optimizer.threshold", "-1e-08"]),
    ("decay_rate_zero", "schedule: {decay_rate: 0}", [], ["schedule.decay_rate", "(0, 1]"]),
    ("decay_rate_above_one", "schedule: {decay_rate: 1.5}", [], ["schedule.decay_rate", "1.5"]),
    ("alpha_above_one", "schedule: {name: cosine, alpha: 2}", [], ["schedule.alpha", "2 is out"]),
    ("warmup_negative", "schedule: {warmup_epochs: -1}", [], ["schedule.warmup_epochs", "-1"]),
    ("final_lr_above_lr", "schedule: {name: exponential, final_learning_rate: 0.1}", [],
     ["schedule.final_learning_rate", "0.1", "optimizer.learning_rate"]),
    ("unknown_dataset", "dataset: {name: imagenet}", [],
     ["dataset.name", "'imagenet'", "mnist, fashion_mnist, cifar10"]),
    ("misspelt_dataset", "dataset: {name: mnsit}", [], ["dataset.name", "did you mean 'mnist'"]),
    ("unknown_model", "model: {name: resnet50}", [], ["model.name", "'resnet50'", "vgg_small"]),
    ("unknown_model_option", "model: {options: {hidden_unit: [10]}}", [],
     ["model.options.hidden_unit", "binarynet_mlp", "did you mean 'hidden_units'"]),
    ("option_of_another_model", "model: {name: binarynet_mlp, options: {filters: [8]}}", [],
     ["model.options.filters", "unknown option"]),
    ("option_wrong_type", "model: {options: {hidden_units: 256}}", [],
     ["model.options.hidden_units", "256 (int)", "list of positive integers"]),
    ("option_bad_list", "model: {options: {hidden_units: [64, 0]}}", [],
     ["model.options.hidden_units", "[64, 0]"]),
    ("option_bool_for_float", "model: {options: {dropout: true}}", [],
     ["model.options.dropout", "True (bool)"]),
    ("unknown_quantizer", "model: {options: {kernel_quantizer: ste_sgn}}", [],
     ["model.options.kernel_quantizer", "'ste_sgn'", "did you mean 'ste_sign'"]),
    ("unknown_quantizer_mapping", "model: {options: {input_quantizer: {name: sign}}}", [],
     ["model.options.input_quantizer", "'sign'"]),
    ("quantizer_bad_argument", "model: {options: {kernel_quantizer: {name: ste_sign, clip: 1}}}",
     [], ["model.options.kernel_quantizer", "'clip'"]),
    ("quantizer_bad_value", "model: {options: {input_quantizer: {name: dorefa, k_bit: 0}}}", [],
     ["model.options.input_quantizer", "k_bit"]),
    ("unknown_optimizer", "optimizer: {name: adamw}", [],
     ["optimizer.name", "'adamw'", "did you mean 'adam'", "bop"]),
    ("unknown_loss", "training: {loss: hinge}", [], ["training.loss", "'hinge'", "squared_hinge"]),
    ("unknown_schedule", "schedule: {name: step}", [], ["schedule.name", "'step'", "cosine"]),
    ("unknown_device", "training: {device: tpu}", [], ["training.device", "'tpu'", "auto, cpu, gpu"]),
    ("unknown_distribute", "training: {distribute: horovod}", [],
     ["training.distribute", "'horovod'", "multi_worker"]),
    ("unknown_mixed_precision", "training: {mixed_precision: float8}", [],
     ["training.mixed_precision", "'float8'", "bfloat16"]),
    ("mixed_precision_true", "training: {mixed_precision: true}", [],
     ["training.mixed_precision", "True (bool)"]),
    ("bad_name", "name: a/b", [], ["name", "'a/b'", "not a valid run name"]),
    ("empty_output_dir", "output_dir: ''", [], ["output_dir", "''"]),
    ("duplicate_key", "training: {epochs: 1}\ntraining: {epochs: 2}", [],
     ["line 2", "duplicate key 'training'"]),
    ("yaml_syntax_error", "training:\n  epochs: [1, 2\n  seed: 3", [],
     ["line 3, column", "YAML syntax error"]),
    ("yaml_tab_indent", "training:\n\tepochs: 3", [], ["line 2, column 1", "YAML syntax error"]),
    ("empty_file", "", [], ["empty file"]),
    ("comments_only", "# nothing yet\n", [], ["empty file"]),
    ("top_level_list", "- training\n- model", [], ["top level", "mapping", "(list)"]),
    ("top_level_scalar", "42", [], ["top level", "42 (int)"]),
    ("not_utf8", b"name: caf\xe9\n", [], ["not UTF-8"]),
    ("missing_file", MISSING, [], ["file not found"]),
    ("directory", DIRECTORY, [], ["is a directory"]),
    ("override_without_equals", "{}", ["training.epochs"], ["--set 'training.epochs'", "'='"]),
    ("override_empty_key", "{}", ["=3"], ["--set '=3'", "empty key"]),
    ("override_empty_path_part", "{}", ["training..epochs=3"], ["training..epochs", "empty key"]),
    ("override_unknown_key", "{}", ["training.epoch=3"],
     ["--set 'training.epoch=3'", "did you mean 'epochs'"]),
    ("override_unknown_section", "{}", ["trainin.epochs=3"], ["trainin", "did you mean 'training'"]),
    ("override_below_a_value", "{}", ["training.epochs.max=3"],
     ["training.epochs.max", "single value"]),
    ("override_into_a_string", "model: {options: {kernel_quantizer: ste_sign}}",
     ["model.options.kernel_quantizer.clip_value=2"], ["kernel_quantizer", "not a mapping"]),
    ("override_bad_yaml", "{}", ["model.options.hidden_units=[1, 2"],
     ["hidden_units", "not valid YAML"]),
    ("override_bad_value", "{}", ["training.epochs=0"],
     ["training.epochs", "--set 'training.epochs=0'", "got 0"]),
    ("override_unknown_option", "{}", ["model.options.units=[3]"],
     ["model.options.units", "--set 'model.options.units=[3]'", "unknown option"]),
    ("override_on_empty_file", "", ["training.epochs=3"], ["empty file"]),
]


@pytest.mark.parametrize("text, overrides, fragments", [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_config_is_one_line_naming_file_key_and_problem(tmp_path, text, overrides, fragments):
    if text is MISSING:
        path = tmp_path / "nope.yaml"
    elif text is DIRECTORY:
        path = tmp_path
    else:
        path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    assert message.startswith(f"{path}: ")
    assert "; " in message  # problem; how to fix
    for fragment in fragments:
        assert fragment in message, message


def test_bad_config_ids_are_distinct():
    assert len({b[0] for b in BAD}) == len(BAD) >= 30


EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))


@pytest.mark.skipif(not EXPERIMENTS, reason="no experiment files")
@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_shipped_experiment_files_are_valid(path):
    config = load_config(path)
    assert config.name == path.stem
    assert parse_config(to_dict(config), source=str(path)) == config


@pytest.mark.parametrize("doc", ["experiments/README.md", "docs/config.md"])
def test_yaml_examples_in_the_docs_are_valid(doc):
    path = ROOT / doc
    if not path.exists():
        pytest.skip(f"{doc} not present")
    blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        config = parse_config(yaml.safe_load(block), source=doc)
        assert config.optimizer.learning_rate == 3e-3


@pytest.mark.parametrize("options, needle", [({}, "is not set"),
                                             ({"path": "nowhere.keras"}, "nowhere.keras")])
def test_a_keras_file_model_needs_an_existing_keras_file(options, needle):
    with pytest.raises(ConfigError, match=needle) as error:
        parse_config({"model": {"name": "keras_file", "options": options}})
    assert "model.options.path" in str(error.value)


@pytest.mark.parametrize("value, read", [("auto", "auto"), ("true", True), ("false", False)])
def test_xla_is_auto_by_default_and_takes_true_false_or_auto(tmp_path, value, read):
    assert parse_config({}).training.xla == "auto"
    path = write(tmp_path, f"training: {{xla: {value}}}\n")
    assert load_config(path).training.xla == read


def test_an_unknown_xla_value_is_one_line_naming_the_choices(tmp_path):
    path = write(tmp_path, "training: {xla: sometimes}\n")
    with pytest.raises(ConfigError, match="training.xla: expected true, false or auto, got "
                                          "'sometimes'") as error:
        load_config(path)
    assert "\n" not in str(error.value)
