"""benchmarks/step_time.py --larq-python: the block protocol, the Larq fields and the paired
ratios, with a stand-in server speaking the protocol (Larq itself is not installed here)."""

import json
import statistics
import sys
import textwrap

import pytest

from support import load_benchmark

# Answers setup like larq_step_time.py; Larq's binary step takes 80 ms, its float step 60 ms;
# the requests it saw are appended to requests.jsonl beside it.
FAKE_SERVER = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    log = Path(__file__).with_name("requests.jsonl")
    MODE = {mode!r}
    for line in sys.stdin:
        request = json.loads(line)
        with log.open("a") as f:
            f.write(line)
        if MODE == "crash" and request["op"] == "block":
            print("Traceback: larq exploded", file=sys.stderr)
            sys.exit(3)
        if MODE == "error" and request["op"] == "setup":
            answer = {{"error": "unknown model 'binarynet_mlp'"}}
        elif request["op"] == "setup":
            answer = {{"ok": True, "larq": "0.0-fake", "tensorflow": "2.fake"}}
        elif request["op"] == "block":
            step = 0.08 if request["precision"] == "binary" else 0.06
            answer = {{"wall": step, "cpu": 2 * step}}
        else:
            answer = {{"ok": True}}
        print(json.dumps(answer), flush=True)
''')


@pytest.fixture(scope="module")
def step_time():
    return load_benchmark("step_time")


def fake_server(tmp_path, monkeypatch, step_time, mode="ok"):
    server = tmp_path / "fake_larq.py"
    server.write_text(FAKE_SERVER.format(mode=mode))
    monkeypatch.setattr(step_time, "LARQ_SCRIPT", server)
    return tmp_path / "requests.jsonl"


def test_larq_blocks_interleave_with_bnn_and_become_paired_ratios(step_time, tmp_path,
                                                                  monkeypatch):
    requests = fake_server(tmp_path, monkeypatch, step_time)
    out = tmp_path / "r.json"
    assert step_time.main(["--quick", "--models", "binarynet_mlp", "--xla", "off",
                           "--larq-python", sys.executable, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    [row] = data["results"]
    assert row["larq_binary_block_ms"] == [80.0] * row["blocks"]
    assert row["larq_float_block_ms"] == [60.0] * row["blocks"]
    assert (row["larq_binary_ms"], row["larq_float_ms"]) == (80.0, 60.0)
    assert row["larq_ratio"] == pytest.approx(80 / 60)
    assert row["larq_cpu_ratio"] == pytest.approx(80 / 60)
    assert row["larq_binary_cpu_ms"] == 160.0
    # bnn / Larq is the median of same-round ratios against Larq's 80 ms blocks.
    assert row["bnn_over_larq"] == pytest.approx(
        statistics.median(ms / 80.0 for ms in row["binary_block_ms"]))
    assert data["machine"]["larq"] == "0.0-fake"
    assert data["machine"]["larq_tensorflow"] == "2.fake"
    sent = [json.loads(line) for line in requests.read_text().splitlines()]
    assert sent[0]["op"] == "setup"
    assert (sent[0]["model"], sent[0]["xla"], sent[0]["batch_size"]) == ("binarynet_mlp",
                                                                        False, 8)
    assert sent[0]["mixed_precision"] == "off"
    blocks = [r["precision"] for r in sent if r["op"] == "block"]
    assert sorted(blocks) == sorted(["binary", "float"] * row["blocks"])


@pytest.mark.parametrize("mode, message", [
    ("error", "unknown model 'binarynet_mlp'"),
    ("crash", "larq exploded"),
])
def test_a_failing_larq_side_exits_with_its_reason(step_time, tmp_path, monkeypatch, mode,
                                                   message):
    fake_server(tmp_path, monkeypatch, step_time, mode)
    with pytest.raises(SystemExit) as exit_info:
        step_time.main(["--quick", "--models", "binarynet_mlp", "--xla", "off",
                        "--larq-python", sys.executable])
    assert message in str(exit_info.value.code)
    assert "Larq benchmark" in str(exit_info.value.code)


def test_larq_is_asked_for_the_same_mixed_precision(step_time, tmp_path, monkeypatch):
    requests = fake_server(tmp_path, monkeypatch, step_time)
    assert step_time.main(["--quick", "--models", "binarynet_mlp", "--xla", "off",
                           "--mixed-precision", "bfloat16", "--larq-python",
                           sys.executable]) == 0
    sent = [json.loads(line) for line in requests.read_text().splitlines()]
    assert [r["mixed_precision"] for r in sent if r["op"] == "setup"] == ["bfloat16"]


def test_a_larq_python_that_does_not_exist_is_named(step_time, tmp_path):
    missing = tmp_path / "no-such-env" / "python"
    with pytest.raises(SystemExit) as exit_info:
        step_time.main(["--quick", "--larq-python", str(missing)])
    assert str(missing) in str(exit_info.value.code)
    assert "larq and tf-keras" in str(exit_info.value.code)
