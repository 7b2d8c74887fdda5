"""The README's first Python example runs as written and builds a working BinaryNet MLP."""

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_binarynet_example_builds_trains_and_exposes_binary_weights():
    namespace: dict = {}
    exec(python_blocks()[0], namespace)  # noqa: S102 - the README's own example
    model = namespace["model"]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(64, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, size=64)
    history = model.fit(x / 127.5 - 1, y, epochs=1, batch_size=32, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    exec(python_blocks()[1], namespace)  # noqa: S102
    kernel = namespace["layer"].binary_kernel().numpy()
    assert kernel.shape == (784, 2048) and set(np.unique(kernel)) == {-1.0, 1.0}
    assert np.abs(namespace["layer"].kernel.numpy()).max() <= 1.0
