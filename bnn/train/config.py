"""Experiment files: YAML -> typed, validated, frozen dataclasses.

An experiment file has the top-level keys ``name``, ``dataset``, ``model``, ``optimizer``,
``schedule``, ``training`` and ``output_dir``; every section and every field is optional and
falls back to the defaults below. :func:`load_config` reads a file, applies ``--set``-style
overrides (``training.epochs=3``) and validates everything up front, so a run never dies
half-way through because of a typo.

Every user mistake raises :class:`ConfigError` with a single line of the form::

    <file>: <key path>: <problem>; <what is allowed / how to fix>

Type rules: ``bool`` fields take only ``true``/``false``; ``int`` fields take only whole numbers
(not booleans, not ``10.0``, not the string ``"10"``); ``float`` fields take ints, floats and
numeric strings, because YAML 1.1 reads ``1e-3`` (no dot) as the string ``"1e-3"``. NaN and
infinities are rejected everywhere.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from bnn import catalog
from bnn.catalog import (DATASETS, DEVICES, DISTRIBUTES, HISTOGRAMS, LOSSES, MIXED_PRECISIONS,
                         OPTIMIZERS, PRECISIONS, SCHEDULES)
from bnn.errors import ConfigError

__all__ = [
    "ConfigError",
    "DatasetConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "TrainingConfig",
    "DistillConfig",
    "Config",
    "load_config",
    "parse_config",
    "apply_override",
    "to_dict",
    "dump_config",
    "hparams",
]

DISTILL_FLOAT_TWIN = "float_twin"

_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NUMBER_PATTERN = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_DEFAULT_NAME = "experiment"
_DATASET_OPTIONS = ("input_shape", "num_classes")  # model options the trainer sets from the data


def _show(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a user value, with its YAML type for non-strings."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    kind = {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "mapping",
            type(None): "null"}.get(type(value), type(value).__name__)
    return text if kind == "string" else f"{text} ({kind})"


# -- field rules: each turns a raw YAML value into the typed value or raises ConfigError ----------

Rule = Callable[[Any, str, str], Any]  # (value, source, key path) -> value


def _as_int(minimum: int | None) -> Rule:
    wanted = "a whole number" if minimum is None else f"an integer >= {minimum}"

    def rule(value: Any, source: str, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected a whole number, got {_show(value)}",
                              f"write {wanted}, e.g. 10")
        if minimum is not None and value < minimum:
            raise ConfigError(source, key, f"must be >= {minimum}, got {value}",
                              f"use an integer >= {minimum}")
        return value

    return rule


def _as_float(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Rule:
    lo, hi = "(" if low_open else "[", ")" if high_open or math.isinf(high) else "]"
    interval = f"{lo}{low:g}, {'inf' if math.isinf(high) else f'{high:g}'}{hi}"
    wanted = "a number" if math.isinf(low) else f"a number in {interval}"

    def rule(value: Any, source: str, key: str) -> float:
        number = value
        if isinstance(value, str) and _NUMBER_PATTERN.fullmatch(value.strip()):
            number = float(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(
                number):
            raise ConfigError(source, key, f"expected a finite number, got {_show(value)}",
                              f"write {wanted}, e.g. 0.001")
        number = float(number)
        if (number < low or (low_open and number == low) or number > high
                or (high_open and number == high)):
            raise ConfigError(source, key, f"{number:g} is out of range",
                              f"allowed: {interval}")
        return number

    return rule


def _as_bool(value: Any, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, key, f"expected true or false, got {_show(value)}",
                          "write true or false (unquoted)")
    return value


def _one_of(choices: Sequence[str], what: str) -> Rule:
    def rule(value: Any, source: str, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(source, key, f"unknown {what} {_show(value)}",
                              _suggest(value, choices, "allowed"))
        return value

    return rule


def _xla(value: Any, source: str, key: str) -> bool | str:
    if value is True or value is False or value == "auto":
        return value
    raise ConfigError(source, key, f"expected true, false or auto, got {_show(value)}",
                      "write auto (each twin takes whichever is faster on this machine), true "
                      "or false")


def _mixed_precision(value: Any, source: str, key: str) -> str:
    # YAML 1.1 reads an unquoted `off` or `no` as false.
    return _one_of(MIXED_PRECISIONS, "mixed precision")("off" if value is False else value,
                                                         source, key)


def _optional(rule: Rule) -> Rule:
    def optional(value: Any, source: str, key: str) -> Any:
        return None if value is None else rule(value, source, key)

    return optional


def _suggest(value: Any, known: Sequence[str], label: str) -> str:
    close = difflib.get_close_matches(value, known, n=1) if isinstance(value, str) else []
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"{guess}{label}: {', '.join(known)}"


def _f(default: Any, rule: Rule) -> Any:
    """A dataclass field with its validation rule in the metadata."""
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


# -- the schema ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DatasetConfig:
    """Which dataset, and how much of it."""

    name: str = _f("mnist", _one_of(DATASETS, "dataset"))
    validation_split: float = _f(0.0, _as_float(0.0, 1.0, high_open=True))
    augment: bool = _f(True, _as_bool)
    limit_train: int | None = _f(None, _optional(_as_int(1)))
    limit_test: int | None = _f(None, _optional(_as_int(1)))
    cutout: int = _f(0, _as_int(0))
    on_device: bool = _f(False, _as_bool)


def _model_options(value: Any, source: str, key: str) -> dict:
    """Checked later against the model name, in :func:`_check_model_options`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(source, key, f"expected a mapping of builder options, got {_show(value)}",
                          "write e.g. 'options: {hidden_units: [256, 256]}'")
    return copy.deepcopy(dict(value))


@dataclass(frozen=True)
class ModelConfig:
    """An architecture from :func:`bnn.catalog.model_names`, the precision that `bnn train` uses
    (`bnn compare` trains both), and keyword options of its builder."""

    name: str = _f("binarynet_mlp", _one_of(catalog.model_names(), "model"))
    precision: str = _f("binary", _one_of(PRECISIONS, "precision"))
    options: dict = _f({}, _model_options)


@dataclass(frozen=True)
class OptimizerConfig:
    """``adam``, ``sgd`` (momentum, nesterov) or ``bop`` (binary kernels flip when the
    exponential moving average ``m <- (1 - gamma) m + gamma g`` of their gradient exceeds
    ``threshold`` with the same sign as the weight; all other variables use Adam with
    ``learning_rate``). Fields of the other optimizers are accepted and ignored."""

    name: str = _f("adam", _one_of(OPTIMIZERS, "optimizer"))
    learning_rate: float = _f(1e-3, _as_float(0.0, math.inf, low_open=True))
    momentum: float = _f(0.9, _as_float(0.0, 1.0, high_open=True))
    nesterov: bool = _f(False, _as_bool)
    weight_decay: float = _f(0.0, _as_float(0.0, math.inf))
    beta_1: float = _f(0.9, _as_float(0.0, 1.0, high_open=True))
    beta_2: float = _f(0.999, _as_float(0.0, 1.0, high_open=True))
    epsilon: float = _f(1e-7, _as_float(0.0, math.inf, low_open=True))
    threshold: float = _f(1e-8, _as_float(0.0, math.inf, low_open=True))
    gamma: float = _f(1e-4, _as_float(0.0, 1.0, low_open=True))


@dataclass(frozen=True)
class ScheduleConfig:
    """Learning rate at epoch ``e`` of ``E`` (see :class:`bnn.train.schedules.EpochSchedule`):
    ``constant``: ``lr``; ``cosine``: ``lr (alpha + (1 - alpha)(1 + cos(pi e / E)) / 2)``;
    ``exponential``: ``lr * decay_rate ** floor(e)``, where a set ``final_learning_rate`` wins
    over ``decay_rate`` and fixes it to ``(final / lr) ** (1 / (E - 1))``. A positive
    ``warmup_epochs`` multiplies by a linear ramp from 0 to 1 over those epochs."""

    name: str = _f("constant", _one_of(SCHEDULES, "schedule"))
    decay_rate: float = _f(0.96, _as_float(0.0, 1.0, low_open=True))
    final_learning_rate: float | None = _f(None, _optional(_as_float(0.0, math.inf, low_open=True)))
    warmup_epochs: int = _f(0, _as_int(0))
    alpha: float = _f(0.0, _as_float(0.0, 1.0))


def _teacher(value: Any, source: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(source, key, f"expected 'float_twin' or a path, got {_show(value)}",
                          "write float_twin, a run directory or a .keras file")
    return value


@dataclass(frozen=True)
class DistillConfig:
    """Distillation of the binary twin from a real-valued teacher (:mod:`bnn.train.distill`):
    ``teacher`` is ``float_twin`` (the run's own float twin, trained first) or a run directory
    or ``.keras`` file; the loss is ``(1 - weight) * hard loss + weight * temperature**2 *
    KL(teacher || student)`` on logits divided by ``temperature``."""

    teacher: str = _f(DISTILL_FLOAT_TWIN, _teacher)
    temperature: float = _f(1.0, _as_float(0.0, math.inf, low_open=True))
    weight: float = _f(1.0, _as_float(0.0, 1.0))


def _distill(value: Any, source: str, key: str) -> DistillConfig | None:
    if value is None:
        return None
    return _parse_section(DistillConfig, value, source, key)


@dataclass(frozen=True)
class TrainingConfig:
    """The training loop: length, batch, loss, devices, precision, checkpoints, logging."""

    epochs: int = _f(10, _as_int(1))
    batch_size: int = _f(100, _as_int(1))
    seed: int = _f(0, _as_int(0))
    loss: str = _f("crossentropy", _one_of(LOSSES, "loss"))
    label_smoothing: float = _f(0.0, _as_float(0.0, 1.0, high_open=True))
    device: str = _f("auto", _one_of(DEVICES, "device"))
    xla: bool | str = _f("auto", _xla)
    mixed_precision: str = _f("off", _mixed_precision)
    distribute: str = _f("none", _one_of(DISTRIBUTES, "distribution strategy"))
    checkpoints_keep: int = _f(3, _as_int(1))
    deterministic: bool = _f(False, _as_bool)
    histogram_freq: int = _f(1, _as_int(0))
    histograms: str = _f("binary", _one_of(HISTOGRAMS, "histograms choice"))
    distill: DistillConfig | None = _f(None, _distill)
    test_time_flip: bool = _f(False, _as_bool)
    test_time_translate: int = _f(0, _as_int(0))
    test_every: int = _f(1, _as_int(0))


@dataclass(frozen=True)
class Config:
    """A whole experiment. ``output_dir`` defaults to ``runs/<name>``; ``source`` is the file
    it was read from (not a YAML key)."""

    name: str
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    output_dir: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not self.output_dir:
            object.__setattr__(self, "output_dir", f"runs/{self.name}")


_SECTIONS: dict[str, type] = {
    "dataset": DatasetConfig,
    "model": ModelConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "training": TrainingConfig,
}
_TOP_LEVEL = ("name", *_SECTIONS, "output_dir")


# -- parsing -------------------------------------------------------------------------------------

def _check_keys(data: Mapping, known: Sequence[str], source: str, prefix: str) -> None:
    for key in data:
        path = f"{prefix}{key}"
        if not isinstance(key, str):
            raise ConfigError(source, path, f"key {_show(key)} is not a name",
                              f"keys are names; known keys: {', '.join(known)}")
        if key not in known:
            raise ConfigError(source, path, "unknown key", _suggest(key, known, "known keys"))


def _parse_section(cls: type, data: Any, source: str, section: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, section, f"expected a mapping of settings, got {_show(data)}",
                          f"write '{section}:' followed by indented 'key: value' lines")
    fields = dataclasses.fields(cls)
    _check_keys(data, [f.name for f in fields], source, f"{section}.")
    values = {f.name: f.metadata["rule"](data[f.name], source, f"{section}.{f.name}")
              for f in fields if f.name in data}
    return cls(**values)


def _builder_defaults(model: str) -> dict[str, Any]:
    """Defaults of the keyword options of architecture ``model``."""
    return catalog.MODEL_OPTIONS[model]


def _check_quantizer(value: Any, source: str, key: str) -> None:
    """A quantizer is null, a name, or ``{name: NAME, ARG: VALUE, ...}`` with the arguments of
    that quantizer's class (:data:`bnn.catalog.QUANTIZER_ARGUMENTS`)."""
    if value is None:
        return
    name = value.get("name") if isinstance(value, dict) else value
    known = catalog.quantizer_names()
    if not isinstance(name, str) or name not in known:
        raise ConfigError(source, key, f"unknown quantizer {_show(value)}",
                          _suggest(name, known, "use null, a name or "
                                   "{name: NAME, ARG: VALUE} with NAME one of"))
    if not isinstance(value, dict):
        return
    arguments = catalog.QUANTIZER_ARGUMENTS[name]
    for argument, given in value.items():
        if argument == "name":
            continue
        where = f"{key}.{argument}"
        if argument not in arguments:
            raise ConfigError(source, where, f"unknown argument {argument!r} of quantizer "
                              f"{name!r}", _suggest(argument, sorted(arguments),
                                                    "its arguments") if arguments
                              else f"{name!r} takes no arguments")
        minimum = catalog.QUANTIZER_MINIMUMS.get((name, argument))
        choices = catalog.QUANTIZER_CHOICES.get((name, argument))
        if minimum is not None:
            _as_int(minimum)(given, source, where)
        elif choices is not None:
            _one_of(choices, f"{argument} of {name}")(given, source, where)
        else:
            _check_option_type(given, arguments[argument], source, where)


def _check_option_type(value: Any, default: Any, source: str, key: str) -> Any:
    """Checks an option value against the type of the builder's default; returns it with
    numeric strings converted for float options."""
    if isinstance(default, bool):
        return _as_bool(value, source, key)
    if isinstance(default, int):
        return _as_int(None)(value, source, key)
    if isinstance(default, float):
        return _as_float(-math.inf, math.inf)(value, source, key)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(source, key, f"expected a string, got {_show(value)}",
                              f"write a name like {default!r}")
        return value
    if isinstance(default, (tuple, list)):
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            raise ConfigError(source, key, f"expected a list of positive integers, got "
                              f"{_show(value)}", f"write e.g. {list(default)}")
        return value
    return value


def _check_model_options(model: ModelConfig, source: str) -> ModelConfig:
    defaults = _builder_defaults(model.name)
    known = sorted(defaults)
    options = {}
    for option, value in model.options.items():
        key = f"model.options.{option}"
        if option not in defaults:
            raise ConfigError(source, key, f"unknown option for model {model.name!r}",
                              _suggest(option, known, "known options"))
        if option.endswith("_quantizer"):
            _check_quantizer(value, source, key)
            options[option] = value
        else:
            options[option] = _check_option_type(value, defaults[option], source, key)
    return dataclasses.replace(model, options=options)


def _parse_name(data: Mapping, source: str) -> str:
    if "name" in data:
        name, where = data["name"], "name"
    else:
        name = _DEFAULT_NAME if source.startswith("<") else Path(source).stem
        where = "name (from the file name)"
    if not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
        raise ConfigError(source, where, f"{_show(name)} is not a valid run name",
                          "use letters, digits, '.', '_' and '-', starting with a letter or digit")
    return name


def _parse(data: Any, source: str) -> Config:
    if data is None:
        raise ConfigError(source, "", "empty file (no settings)",
                          "write at least one section, e.g. 'training: {epochs: 10}'")
    if not isinstance(data, Mapping):
        raise ConfigError(source, "", f"top level must be a mapping, got {_show(data)}",
                          f"write 'key: value' lines with keys {', '.join(_TOP_LEVEL)}")
    _check_keys(data, _TOP_LEVEL, source, "")
    name = _parse_name(data, source)
    sections = {s: _parse_section(cls, data.get(s), source, s) for s, cls in _SECTIONS.items()}
    sections["model"] = _check_model_options(sections["model"], source)
    output_dir = data.get("output_dir", f"runs/{name}")
    if not isinstance(output_dir, str) or not output_dir.strip():
        raise ConfigError(source, "output_dir", f"expected a directory path, got "
                          f"{_show(output_dir)}", f"write a path such as 'runs/{name}'")
    config = Config(name=name, output_dir=output_dir, source=source, **sections)
    _cross_check(config)
    return config


def _cross_check(config: Config) -> None:
    """The few checks that span sections."""
    final, lr = config.schedule.final_learning_rate, config.optimizer.learning_rate
    if final is not None and final > lr:
        raise ConfigError(config.source, "schedule.final_learning_rate",
                          f"{final:g} is above optimizer.learning_rate {lr:g}",
                          "the exponential schedule only decays; set it <= the learning rate")
    if config.model.name == "keras_file":
        path = config.model.options.get("path", "")
        if not path.endswith(".keras") or not os.path.isfile(path):
            raise ConfigError(config.source, "model.options.path",
                              f"no .keras file at {path!r}" if path else "is not set",
                              "give the Keras 3 .keras file to train (bnn import-larq converts "
                              "models saved by Larq)")


def parse_config(data: Mapping, source: str = "<config>", overrides: Sequence[str] = ()) -> Config:
    """Validates ``data`` (a parsed experiment file) after applying ``overrides`` in order.

    ``source`` names the origin in error messages and in :attr:`Config.source`; when ``data``
    has no ``name``, the name is the stem of ``source`` (``"experiment"`` for ``"<...>"``).

    Raises:
        ConfigError: for anything invalid; a problem in a value set by an override names it.
    """
    if not isinstance(data, Mapping):
        return _parse(data, source)
    data = copy.deepcopy(dict(data))
    origins: dict[str, str] = {}
    for assignment in overrides:
        apply_override(data, assignment, source)
        origins[assignment.split("=", 1)[0].strip()] = assignment
    try:
        return _parse(data, source)
    except ConfigError as error:
        for path, assignment in reversed(list(origins.items())):
            if error.key == path or error.key.startswith(path + ".") or path.startswith(
                    error.key + "."):
                raise ConfigError(source, f"{error.key} (from --set {assignment!r})",
                                  error.problem, error.hint) from None
        raise


def apply_override(data: dict, assignment: str, source: str) -> None:
    """Applies one ``KEY.PATH=VALUE`` assignment to raw experiment ``data`` in place.

    ``VALUE`` is parsed as YAML: ``training.epochs=3``, ``training.xla=false``,
    ``model.options.hidden_units=[256, 256]``, ``model.options.kernel_quantizer={name:
    ste_sign, clip_value: 0.5}``. The key path must exist in the schema (any name is allowed
    below ``model.options``; option names are checked when the config is parsed).

    Raises:
        ConfigError: for a malformed assignment, an unknown key path or an unparsable value.
    """
    where = f"--set {assignment!r}"
    example = "write KEY.PATH=VALUE, e.g. training.epochs=3"
    if "=" not in assignment:
        raise ConfigError(source, where, "missing '='", example)
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(source, where, f"empty key in {key.strip()!r}", example)
    try:
        value = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(source, where, f"value is not valid YAML ({problem})",
                          "quote the value the way you would in the file") from None
    _check_override_path(parts, source, where)
    target = data
    for depth, part in enumerate(parts[:-1]):
        child = target.setdefault(part, {})
        if child is None:
            child = target[part] = {}
        if not isinstance(child, dict):
            inner = ".".join(parts[: depth + 1])
            raise ConfigError(source, where, f"{inner} is {_show(child)}, not a mapping",
                              f"set the whole value instead, e.g. {inner}={{...}}")
        target = child
    target[parts[-1]] = value


def _check_override_path(parts: list[str], source: str, where: str) -> None:
    head = parts[0]
    if head not in _TOP_LEVEL:
        raise ConfigError(source, where, f"unknown key {head!r}",
                          _suggest(head, _TOP_LEVEL, "known keys"))
    if head not in _SECTIONS:
        if len(parts) > 1:
            raise ConfigError(source, where, f"{head} is a single value, not a section",
                              f"write {head}=VALUE")
        return
    known = [f.name for f in dataclasses.fields(_SECTIONS[head])]
    if len(parts) > 1 and parts[1] not in known:
        raise ConfigError(source, where, f"unknown key '{head}.{parts[1]}'",
                          _suggest(parts[1], known, "known keys"))
    if parts[:2] == ["training", "distill"] and len(parts) > 2:
        known = [f.name for f in dataclasses.fields(DistillConfig)]
        if len(parts) > 3 or parts[2] not in known:
            raise ConfigError(source, where, f"unknown key '{'.'.join(parts)}'",
                              _suggest(parts[2], known, "known keys of training.distill"))
        return
    if len(parts) > 2 and (head, parts[1]) != ("model", "options"):
        raise ConfigError(source, where, f"{head}.{parts[1]} is a single value, not a section",
                          f"write {head}.{parts[1]}=VALUE")


# -- files ---------------------------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key repeated in one mapping is an error (PyYAML
    would silently keep the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Reads, overrides and validates experiment file ``path``.

    Raises:
        ConfigError: for a missing, unreadable or invalid file, or a bad override.
    """
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "file not found",
                          f"check the path (relative to {os.getcwd()})") from None
    except IsADirectoryError:
        found = sorted(p.name for p in Path(source).glob("*.yaml"))
        hint = f"pick one of: {', '.join(found)}" if found else "give a .yaml file"
        raise ConfigError(source, "", "is a directory, not a file", hint) from None
    except PermissionError:
        raise ConfigError(source, "", "permission denied",
                          "make the file readable or copy it somewhere readable") from None
    except UnicodeDecodeError as error:
        raise ConfigError(source, "", f"not UTF-8 text (byte {error.start})",
                          "save the file as UTF-8") from None
    except OSError as error:
        raise ConfigError(source, "", f"cannot read: {error.strerror}",
                          "check the path and its permissions") from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        hint = ("keep one of them, or merge them" if problem.startswith("duplicate key") else
                "fix the YAML there (indentation, ':' after keys, closing brackets and quotes)")
        raise ConfigError(source, where, f"YAML syntax error: {problem}", hint) from None
    return parse_config(data, source, overrides)


def to_dict(config: Config) -> dict:
    """A plain, YAML-able dict that :func:`parse_config` turns back into ``config`` (all but
    :attr:`Config.source`)."""
    data = {"name": config.name}
    for section in _SECTIONS:
        data[section] = dataclasses.asdict(getattr(config, section))
    data["output_dir"] = config.output_dir
    return copy.deepcopy(data)


def dump_config(config: Config, path: str | os.PathLike) -> None:
    """Writes ``config`` as YAML to ``path``, creating its parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None),
                    encoding="utf-8")


def hparams(config: Config) -> dict[str, bool | int | float | str]:
    """Flat ``"section.key" -> scalar`` hyperparameters for the TensorBoard hparams dashboard.

    Model options are listed as ``model.options.<option>`` with the builder's defaults filled
    in, except ``input_shape`` and ``num_classes``, which the trainer takes from the dataset
    (listed only when set); lists and mappings become JSON strings. Fields that are null (e.g.
    ``dataset.limit_train``) are left out, since the dashboard needs one type per column.
    """
    flat: dict[str, Any] = {}
    for section in _SECTIONS:
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            if key != "options":
                flat[f"{section}.{key}"] = value
    defaults = {key: value for key, value in _builder_defaults(config.model.name).items()
                if key not in _DATASET_OPTIONS}
    options = {**defaults, **config.model.options}
    for key, value in sorted(options.items()):
        flat[f"model.options.{key}"] = value
    return {key: value if isinstance(value, (bool, int, float, str)) else
            json.dumps(list(value) if isinstance(value, tuple) else value, sort_keys=True)
            for key, value in flat.items() if value is not None}
