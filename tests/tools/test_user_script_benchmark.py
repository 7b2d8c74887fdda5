"""benchmarks/user_script.py runs a user's plain script in fresh processes with a clean
environment and writes every field it reports."""

import json
import math

from support import load_benchmark


def test_quick_run_times_both_twins_both_ways_and_their_best_ratio(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")  # not passed on to the script
    monkeypatch.setenv("BNN_NATIVE_KERNELS", "0")
    user_script = load_benchmark("user_script")
    env = user_script.clean_environment()
    assert "TF_CPU_ALLOCATOR_USE_BFC" not in env and not any(k.startswith("BNN_") for k in env)
    assert user_script.main(["--quick", "--json", str(tmp_path / "r.json")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    for twin in ("binary", "float"):
        row = data[twin]
        assert set(row["ms"]) == {"default", "xla"} and row["best"] in row["ms"]
        assert all(math.isfinite(ms) and ms > 0 for ms in row["ms"].values())
        assert row["best_ms"] == min(row["ms"].values())
        assert [len(runs) for runs in row["rounds_ms"].values()] == [1, 1]
    assert math.isfinite(data["ratio"]) and data["ratio"] > 0
    assert (data["rounds"], data["units"]) == (1, 64) and data["cpu"]
    assert "binary/float at each one's best" in capsys.readouterr().out
