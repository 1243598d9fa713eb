"""The `inferlab` command and README's promises: demo, make-tiny-model, trace."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from inferlab.cli import main
from courseware.demo import DEMO_CONVERSATIONS, DEMO_MAX_NUM_SEQS, run_demo
from reference.metrics import check_lifecycle, read_log, request_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_prints_table_and_writes_log(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "demo.jsonl"
    console = Console(record=True, width=160)
    outputs = run_demo(None, str(log), console=console, device="cpu")
    text = console.export_text()
    assert "TTFT" in text and "TPOT" in text and str(log) in text
    assert (tmp_path / "cache" / "tiny-qwen3-seed0" / "config.json").is_file()
    events = read_log(log)
    assert check_lifecycle(events) == []
    metrics = request_metrics(events)
    assert len(outputs) == len(metrics) == len(DEMO_CONVERSATIONS)
    for (_, max_tokens), out, m in zip(DEMO_CONVERSATIONS, outputs, metrics.values()):
        assert m.num_output_tokens == len(out["token_ids"]) <= max_tokens
    # More requests than slots: some must have queued behind others (continuous batching).
    assert len(DEMO_CONVERSATIONS) > DEMO_MAX_NUM_SEQS
    first_scheduled = {}
    for e in events:
        if e["event"] == "SCHEDULED":
            first_scheduled.setdefault(e["seq_id"], e["step"])
    assert min(first_scheduled.values()) < max(first_scheduled.values())


def test_make_tiny_model_and_trace_commands(tmp_path, capsys):
    assert main(["make-tiny-model", str(tmp_path / "m"), "--seed", "3"]) == 0
    assert (tmp_path / "m" / "model.safetensors").is_file()
    log = tmp_path / "d.jsonl"
    assert main(["demo", "--device", "cpu", "--model", str(tmp_path / "m"), "--log", str(log)]) == 0
    capsys.readouterr()
    assert main(["trace", str(log)]) == 0
    out = capsys.readouterr().out
    assert "Requests" in out and "Summary" in out and "Steps" in out and "lifecycle: OK" in out


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    # A path longer than any console width: the error must stay one line (CI's checkout path is long).
    deep = tmp_path / ("a-rather-long-folder-name-" * 8)
    deep.mkdir()
    bad = deep / "bad[1].jsonl"
    bad.write_text("{not json\n")
    assert main(["trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}, line 1" in err, err
    assert main(["demo", "--device", "cpu", "--model", str(tmp_path / "missing")]) == 2


@pytest.mark.parametrize("argv, problem", [
    (["serve", "--port", "99999"], "--port: must be a TCP port (0 to 65535), got 99999"),
    (["serve", "--max-waiting-requests", "0"], "--max-waiting-requests: must be at least 1, got 0"),
    (["serve", "--max-request-bytes", "-1"], "--max-request-bytes: must be at least 1, got -1"),
    (["serve", "--drain-timeout", "-5"], "--drain-timeout: must be a finite number of seconds, 0 or more, got -5"),
    (["bench", "serve", "--request-rate", "5", "-1"], "--request-rate: must be above 0 (or inf), got -1"),
    (["bench", "serve", "--request-rate", "nan"], "--request-rate: must be above 0 (or inf), got nan"),
    (["bench", "serve", "--num-prompts", "0"], "--num-prompts: must be at least 1, got 0"),
    (["bench", "serve", "--burstiness", "inf"], "--burstiness: must be a finite number above 0, got inf"),
    (["bench", "serve", "--random-range-ratio", "1"], "--random-range-ratio: must be at least 0 and below 1, got 1"),
    (["bench", "serve", "--max-concurrency", "0"], "--max-concurrency: must be at least 1, got 0"),
    (["bench", "serve", "--disconnect", "-2"], "--disconnect: must be 0 or more, got -2"),
    (["bench", "serve", "--num-prompts", "abc"], "--num-prompts: invalid count value: 'abc'"),
])
def test_measurement_flags_out_of_range_are_refused_by_name(argv, problem, capsys):
    """Before, a port of 99999 ended in an OverflowError traceback and a rate of -1 or a queue of 0 went through."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert problem in capsys.readouterr().err


def test_bench_serve_without_a_server_says_so_in_one_line(capsys):
    import socket
    with socket.socket() as probe:            # a port nobody listens on once this socket is closed
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert main(["bench", "serve", "--num-prompts", "2", "--url", f"http://127.0.0.1:{free}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no answer from the server at http://127.0.0.1:{free}" in err, err


def test_ci_runs_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    setup, test_command = blocks[0], blocks[1]
    from courseware.release_code import TORCH_VERSION
    assert "inferlab demo" in setup and f"torch=={TORCH_VERSION}" in setup
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command.strip() in ci, f"README's test command {test_command!r} is not what .ci/run runs"
    assert f"torch=={TORCH_VERSION}" in ci
    # The system packages of README's PDF setup are the ones CI installs.
    apt = next(b for b in blocks if "apt-get install" in b)
    packages = apt.split("--no-install-recommends", 1)[1].split()
    assert packages and all(re.search(rf"\b{re.escape(p)}\b", ci) for p in packages), packages


def test_bench_sync_and_async_on_the_cpu(tiny_model_dir, tmp_path):
    """`inferlab bench --scheduling both` runs the engine twice and accounts for every token of the workload."""
    import json

    from courseware.bench import make_workload
    out = tmp_path / "bench.json"
    assert main(["bench", "--workload", "quick", "--model", tiny_model_dir, "--device", "cpu", "--dtype", "float32",
                 "--scheduling", "both", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    requests = make_workload("quick", 1024)
    prompt_tokens = sum(len(r.prompt) for r in requests)
    output_tokens = sum(r.output_len for r in requests)
    assert set(result["engines"]) == {"sync", "async"}
    assert result["engine"] is not None and result["async_over_sync"] > 0
    for mode, engine in result["engines"].items():
        assert engine["async_scheduling"] == (mode == "async")
        assert engine["output_tokens"] == output_tokens
        bands = engine["time_by_batch"]
        # Every prompt token is prefilled once (the warm-up leaves no prefix hits); each request's first
        # output token comes from its prefill, every other one from a decode step.
        assert sum(b["tokens"] for b in bands if b["steps"] == "prefill") == prompt_tokens
        assert sum(b["tokens"] for b in bands if b["steps"] != "prefill") == output_tokens - len(requests)
        assert 0 < sum(b["seconds"] for b in bands) <= engine["elapsed_s"] + 1e-6


def test_engine_flags_leave_the_defaults_to_the_engine():
    """An engine flag left out is not passed on, so Config's default applies (one definition of each setting);
    its choices are Config's. The bench's one departure is stated in courseware/bench.py."""
    import subprocess
    import sys

    from courseware.bench import BENCH_ENGINE
    from inferlab.cli import BACKENDS, DEVICES, DTYPES, build_parser, engine_settings
    from reference import config

    assert (DEVICES, BACKENDS, DTYPES) == (config.DEVICES, config.BACKENDS, tuple(config.DTYPES))
    engine_flags = ("device", "dtype", "max_num_seqs", "max_num_batched_tokens", "block_size",
                    "num_kvcache_blocks", "max_model_len", "backend", "tensor_parallel_size")
    for command in (["serve"], ["bench"], ["demo"]):
        args = vars(build_parser().parse_args(command))
        given = {flag: args[flag] for flag in engine_flags if flag in args and args[flag] is not None}
        assert not given or given == {"dtype": "bfloat16"} and command == ["bench"], (command, given)
    args = build_parser().parse_args(["serve", "--max-num-seqs", "3", "--enforce-eager"])
    assert engine_settings(args, {"max_num_seqs": "max_num_seqs", "enforce_eager": "enforce_eager",
                                  "block_size": "kvcache_block_size"}) == {"max_num_seqs": 3, "enforce_eager": True}
    assert BENCH_ENGINE["max_num_batched_tokens"] != config.Config.__dataclass_fields__["max_num_batched_tokens"].default
    # Building the parser (every `inferlab` command does) imports no engine: torch is not loaded.
    code = "import sys; from inferlab.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
