"""Where and how training runs: device, precision policy, determinism and seeds, and the
``tf.distribute`` strategy (one device, ``mirrored`` over local devices, or ``multi_worker``
across processes described by ``TF_CONFIG``)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Iterator

import keras
import tensorflow as tf

from bnn import settings
from bnn.catalog import POLICIES
from bnn.native import dispatch
from bnn.train.config import Config
from bnn.errors import TrainingError

__all__ = ["TrainingError", "configure_runtime", "make_strategy", "is_chief", "worker_run_dir"]


def configure_runtime(config: Config) -> None:
    """Device, precision policy, determinism and seeds, before any model is built, after
    checking the ``BNN_*`` kernel settings (:func:`bnn.settings.check`); selects TensorFlow's
    pooling CPU allocator where TensorFlow has not allocated yet
    (:func:`bnn.settings.select_pooling_allocator`)."""
    settings.check()
    settings.select_pooling_allocator()
    t = config.training
    gpus = dispatch.has_gpu()
    if t.device == "gpu" and not gpus:
        raise TrainingError("training.device is 'gpu' but TensorFlow sees no GPU; install "
                            "bnn[gpu] on a machine with CUDA, or set training.device=cpu")
    if t.device == "cpu" and gpus:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # already initialised in this process
            pass
    keras.mixed_precision.set_global_policy(POLICIES[t.mixed_precision])
    if t.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(t.seed)


def make_strategy(config: Config) -> tf.distribute.Strategy:
    """The ``tf.distribute`` strategy of ``training.distribute``: ``mirrored`` replicates over all
    local GPUs (else all logical CPUs); ``multi_worker`` joins the cluster described by the
    ``TF_CONFIG`` environment variable, one strategy per process (see ``worker_run_dir``)."""
    kind = config.training.distribute
    if kind == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            return tf.distribute.MirroredStrategy([d.name for d in gpus])
        # CPU replicas reduce through one device: CPU collectives of two strategies created in
        # one process can collide on their instance keys
        return tf.distribute.MirroredStrategy(
            [d.name for d in tf.config.list_logical_devices("CPU")],
            cross_device_ops=tf.distribute.ReductionToOneDevice())
    if kind == "multi_worker":
        return _multi_worker_strategy()
    return tf.distribute.get_strategy()


class _MultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """``MultiWorkerMirroredStrategy`` whose ``reduce`` Keras ``fit`` and ``evaluate`` can use:
    it takes a nest (tuple, list, dict) of values and reduces each leaf, and reduces a scalar
    across replicas whatever ``axis`` says (a scalar has no axis to reduce). Keras reduces whole
    ``(x, y)`` input batches, and its scalar metrics with ``axis=0``; the base class fails on both
    as soon as there is more than one worker."""

    def reduce(self, reduce_op, value, axis):
        reduce_one = super().reduce

        def leaf(v):
            scalar = self.experimental_local_results(v)[0].shape.rank == 0
            return reduce_one(reduce_op, v, None if scalar else axis)

        return tf.nest.map_structure(leaf, value)


_WORKER_STRATEGY: list[tf.distribute.Strategy] = []


def _multi_worker_strategy() -> tf.distribute.Strategy:
    """The process's one multi-worker strategy, created on first use: it starts this worker's
    server and waits until every worker of ``TF_CONFIG`` has joined."""
    if not _WORKER_STRATEGY:
        _tf_config()
        _WORKER_STRATEGY.append(_MultiWorkerStrategy())
    return _WORKER_STRATEGY[0]


def _tf_config() -> tuple[dict, str, int]:
    """``(cluster, task type, task index)`` of this process, from the ``TF_CONFIG`` variable."""
    raw = settings.tf_config()
    try:
        spec = json.loads(raw)
        return dict(spec["cluster"]), str(spec["task"]["type"]), int(spec["task"]["index"])
    except (ValueError, TypeError, KeyError, AttributeError):
        raise TrainingError(
            f"training.distribute is 'multi_worker' but TF_CONFIG ({raw[:80]!r}) is not JSON like "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}; '
            "set it for each worker (see docs/distributed.md)") from None


def _is_chief_task(cluster: dict, task_type: str | None, task_id: int) -> bool:
    """The chief is the task of type ``chief``, or worker 0 when the cluster has no ``chief``;
    a process outside any cluster is its own chief."""
    if not cluster or task_type is None:
        return True
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and task_id == 0


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return True
    return _is_chief_task(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id)


@contextlib.contextmanager
def worker_run_dir(config: Config, run_dir: Path) -> Iterator[Path]:
    """The directory this process writes its run to: ``run_dir`` itself, except on a non-chief
    worker of ``training.distribute: multi_worker``, which writes to a fresh temporary directory
    removed on exit. All workers may so be given the same ``run_dir`` (on a shared filesystem
    too): only the chief writes config, checkpoints, TensorBoard events, model and report there.

    For ``multi_worker`` this joins the cluster first (waiting until every worker has started), so
    that an error on any worker later reaches the others instead of leaving them waiting to join.
    """
    if config.training.distribute != "multi_worker":
        yield Path(run_dir)
        return
    cluster, task, index = _tf_config()
    t = config.training
    if t.xla is True and (t.device == "cpu" or not dispatch.has_gpu()):
        raise TrainingError("training.xla is true, but TensorFlow cannot compile multi_worker "
                            "collectives with XLA on CPUs; set training.xla=false")
    configure_runtime(config)
    make_strategy(config)
    if _is_chief_task(cluster, task, index):
        yield Path(run_dir)
        return
    with tempfile.TemporaryDirectory(prefix=f"bnn-{task}{index}-") as scratch:
        yield Path(scratch)
