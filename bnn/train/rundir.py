"""The run directory: checkpoints kept N deep, and a single-writer lock.

Layout::

    RUN_DIR/
      config.yaml               the resolved configuration
      report.json, report.md    written when a run finishes
      .lock                     pid of the process writing here
      <label>/                  one per twin ("binary", "float"): its TensorBoard run
                                (bnn.train.board), and
        model.keras             the final model
        checkpoints/epoch-0003.keras, state-0003.json   the last ``keep`` complete epochs
        checkpoints/interrupted.keras, interrupted.json  a run stopped by SIGINT/SIGTERM mid-epoch
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from bnn.errors import RunDirError
from bnn.files import write_json

__all__ = ["RunDirError", "Checkpoints", "RunLock", "prepare_run_dir"]


_CKPT = re.compile(r"^epoch-(\d{4,})\.keras$")


class Checkpoints:
    """Per-epoch checkpoints of one twin: ``epoch-NNNN.keras`` (model with optimizer state) and
    ``state-NNNN.json`` (trainer state), the state written last so that its presence marks a
    complete checkpoint."""

    def __init__(self, directory: Path, keep: int = 3):
        self.directory = Path(directory)
        self.keep = int(keep)

    def model_path(self, epoch: int) -> Path:
        return self.directory / f"epoch-{epoch:04d}.keras"

    def state_path(self, epoch: int) -> Path:
        return self.directory / f"state-{epoch:04d}.json"

    @property
    def interrupted_model_path(self) -> Path:
        return self.directory / "interrupted.keras"

    @property
    def interrupted_state_path(self) -> Path:
        return self.directory / "interrupted.json"

    def _save_model(self, model, path: Path) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".keras", dir=self.directory)
        os.close(fd)
        try:
            model.save(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def save(self, model, epoch: int, state: dict) -> Path:
        """Saves the model after ``epoch`` complete epochs atomically, prunes to the last
        ``keep`` and drops an older mid-epoch checkpoint."""
        path = self.model_path(epoch)
        self._save_model(model, path)
        write_json(self.state_path(epoch), {**state, "epoch": epoch})
        for old in self.epochs()[: -self.keep]:
            self.state_path(old).unlink(missing_ok=True)
            self.model_path(old).unlink(missing_ok=True)
        self.interrupted_state_path.unlink(missing_ok=True)
        self.interrupted_model_path.unlink(missing_ok=True)
        return path

    def save_interrupted(self, model, epoch: int, batches_done: int, state: dict) -> Path:
        """Saves a run stopped after ``batches_done`` batches of epoch ``epoch + 1`` (``epoch``
        complete epochs before it)."""
        self._save_model(model, self.interrupted_model_path)
        write_json(self.interrupted_state_path,
                   {**state, "epoch": epoch, "batches_done": batches_done})
        return self.interrupted_model_path

    def epochs(self) -> list[int]:
        """Epochs with a complete checkpoint (model and state), ascending."""
        if not self.directory.is_dir():
            return []
        found = [int(m.group(1)) for p in self.directory.iterdir() if (m := _CKPT.match(p.name))]
        return sorted(e for e in found if self.state_path(e).exists())

    def latest(self) -> tuple[int, Path, dict] | None:
        """``(epoch, model_path, state)`` of the newest checkpoint, or None. A mid-epoch
        checkpoint newer than the last complete epoch wins; its state has ``batches_done``."""
        epochs = self.epochs()
        if self.interrupted_state_path.exists() and self.interrupted_model_path.exists():
            state = self._read_state(self.interrupted_state_path)
            if not epochs or state.get("epoch", -1) >= epochs[-1]:
                return int(state["epoch"]), self.interrupted_model_path, state
        if not epochs:
            return None
        epoch = epochs[-1]
        return epoch, self.model_path(epoch), self._read_state(self.state_path(epoch))

    @staticmethod
    def _read_state(state_path: Path) -> dict:
        try:
            state = json.loads(state_path.read_text())
            int(state["epoch"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise RunDirError(
                f"checkpoint state {state_path} is damaged ({type(error).__name__}: {error}); "
                "delete it to resume from the previous checkpoint"
            ) from None
        return state


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """``RUN_DIR/.lock`` holding the writer's pid. A second live writer is refused; a lock
    left by a dead process is taken over."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.held = False

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and _pid_alive(pid):
                    raise RunDirError(
                        f"{self.path.parent} is being written by another bnn process (pid {pid}); "
                        "wait for it to finish or choose another --output-dir"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self.held = True
            return
        raise RunDirError(f"could not take the lock {self.path}; remove it if no bnn process runs")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuses to clobber work: a finished run needs ``--overwrite``, an unfinished one
    ``--resume`` or ``--overwrite``. ``--overwrite`` empties the directory."""
    run_dir = Path(run_dir)
    if overwrite and run_dir.exists():
        for child in run_dir.iterdir():
            if child.name == ".lock":
                continue
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        return
    if resume:
        return
    if (run_dir / "report.json").exists():
        raise RunDirError(f"{run_dir} already holds a finished run; pass --overwrite to replace "
                          "it or --output-dir to write elsewhere")
    twins = [child for child in run_dir.iterdir() if child.is_dir()] if run_dir.is_dir() else []
    if any(Checkpoints(twin / "checkpoints").epochs() for twin in twins):
        raise RunDirError(f"{run_dir} holds an unfinished run; pass --resume to continue it or "
                          "--overwrite to start over")
