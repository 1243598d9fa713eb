"""Every slide listing runs against the engine and prints (or draws) what the slide claims.

The scripts run in-process (one torch import for all of them) with the session's
tiny model; one of them also runs as `python -m slides_code.<name>` to check the
command line the README gives. Figures go to a temporary folder, never the repo.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slides_code import (batching, call_chain, chat_template, chunked_prefill, minimal_log, observability_demo,
                         paged_vs_contiguous, pd_disaggregation, prefix_caching, request_timeline, sequence_fields,
                         tensor_parallel)
from slides_code import _make_listings
from slides_code._common import listings

ROOT = Path(__file__).resolve().parents[2]
SLIDES = ROOT / "slides_code"
LIBRARY_MODULES = {"__init__", "_common", "observability"}   # imported by the scripts, not scripts themselves


@pytest.fixture(autouse=True)
def slides_env(monkeypatch, tiny_model_dir, tmp_path):
    monkeypatch.setenv("INFERLAB_MODEL", tiny_model_dir)
    monkeypatch.setenv("INFERLAB_SLIDES_OUT", str(tmp_path / "out"))


def scripts() -> list[str]:
    return sorted(p.stem for p in SLIDES.glob("*.py") if p.stem not in LIBRARY_MODULES and not p.stem.startswith("_"))


def test_every_script_is_tested_here_and_has_a_short_listing():
    tested = {m.__name__.split(".")[-1] for m in (batching, call_chain, chat_template, chunked_prefill, minimal_log,
                                                  observability_demo, paged_vs_contiguous, pd_disaggregation,
                                                  prefix_caching, request_timeline, sequence_fields,
                                                  tensor_parallel)}
    assert set(scripts()) == tested, "a new slide script needs a test in this file"
    for name in scripts():
        regions = listings(SLIDES / f"{name}.py")
        assert regions, f"{name}.py has no '# --- slide: ... ---' region"
        for title, code in regions.items():
            assert len(code.splitlines()) <= 13, f"{name}.py: listing {title!r} is too long for a slide (about 12 lines)"
    assert "logger.info(stage" in (SLIDES / "observability.py").read_text()


def test_minimal_log(capsys):
    lines = minimal_log.main([])
    out = capsys.readouterr().out
    assert lines and out.strip().splitlines()[:len(lines)] == lines
    # the lecture's print(batch_size, running_size): one line per step, from the STEP events
    per_step = out.strip().splitlines()[len(lines):]
    assert per_step[0] == "step=0 2 2" and len(per_step) == len({ln.split()[0] for ln in lines})
    assert lines[0] == "step=0 request_id=0 prompt_len=6 stage=prefill"
    # max_num_seqs=2: the third request waits until the first two finish
    assert "step=2 request_id=0 prompt_len=6 stage=finished" in lines
    assert "step=3 request_id=2 prompt_len=10 stage=prefill" in lines


def test_chat_template(capsys):
    result = chat_template.main([])
    out = capsys.readouterr().out
    assert "<|im_start|>system" in out and "<|im_start|>assistant" in out
    assert result["prompt"].endswith("<|im_start|>assistant\n")
    assert result["prompt_tokens"] > 3 * result["user_tokens"]
    assert len(result["output"]["token_ids"]) == 16 or result["output"]["finish_reason"] == "stop"


def test_sequence_fields(capsys):
    rows = sequence_fields.main([])
    assert [r["status"] for r in rows] == ["WAITING", "RUNNING", "RUNNING", "FINISHED"]
    queued, prefill, decode, finished = rows
    assert queued["block_table"] == [] and queued["num_cached_tokens"] == 0
    assert prefill["num_cached_tokens"] == 15 and prefill["len"] == 16 and len(prefill["block_table"]) == 2
    assert decode["num_cached_tokens"] == 16 and decode["num_scheduled_tokens"] == 1
    assert finished["block_table"] == [] and finished["finish_reason"] == "length"
    assert len(finished["output_token_ids"]) == 3
    # last_block_num_tokens: tokens in the last block (block size 8) = len - 8 * (full blocks before it)
    assert prefill["last_block_num_tokens"] == 16 - 8 and decode["last_block_num_tokens"] == 17 - 16
    assert "stage=prefill status=RUNNING" in capsys.readouterr().out


def test_batching(tmp_path):
    result = batching.main(["--out", str(tmp_path)])
    # static: every group waits for its longest request (1 prefill + max-1 decode steps per group)
    expected_static = sum(max(batching.OUTPUT_LENGTHS[g:g + batching.BATCH])
                          for g in range(0, len(batching.OUTPUT_LENGTHS), batching.BATCH))
    assert result["static"]["steps"] == expected_static
    assert result["continuous"]["steps"] < result["static"]["steps"]
    assert max(result["static"]["batch_sizes"]) == max(result["continuous"]["batch_sizes"]) == batching.BATCH
    figure = Path(result["figure"])
    assert figure.parent == tmp_path and figure.stat().st_size > 10_000


def test_chunked_prefill(capsys):
    result = chunked_prefill.main([])
    out = capsys.readouterr().out
    for chunk in ("[0, 32)", "[32, 64)", "[64, 96)", "[96, 100)"):
        assert f"request_id=0 prefill chunk {chunk}" in out
    assert result["max_step_tokens"] <= 32 < result["unchunked_max_step_tokens"]
    # the short prompts join the step that finishes the long one, within the budget
    assert [(s, q) for s, q, _, _ in result["chunks"]][-2:] == [(3, 1), (3, 2)]


def test_observability(capsys, tmp_path):
    result = observability_demo.main(["--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "stage=prefill batch_size=4" in out and "stage=finished request_id=5" in out
    assert result["metrics"]["ttft_ms"]["count"] == 6 and result["metrics"]["tpot_ms"]["count"] == 6
    trace = json.loads(Path(result["trace"]).read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"generate", "LLMEngine.step", "Scheduler.schedule", "ModelRunner.run"} <= names
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in trace["traceEvents"])
    assert "online metrics == reference.metrics computed from the log: True" in out
    # trace.annotate("decode_step_begin"): the span names agree with what the log says each step was
    steps = result["annotated_steps"]
    assert steps[0] == ("prefill_step_begin", True) and len(steps) == 4
    assert all(step == ("decode_step_begin", False) for step in steps[1:])


def test_pd_disaggregation(capsys):
    result = pd_disaggregation.main([])
    out = capsys.readouterr().out
    assert result["tokens_equal"], "decode on B after the KV handoff must match a single engine"
    assert result["control_differs"], "without the copied KV the tokens must change"
    assert result["lifecycle_problems"] == []
    assert not result["b_ran_prefill"] and result["a_blocks_in_use"] == 0
    # request 1 shares two full blocks of system prompt with request 0: B has them already
    assert result["transfers"] == [(0, 3), (2, 1), (0, 2)]
    assert "tokens equal to a single-engine run: True" in out
    assert result["processes_tokens_equal"], "the two-process version must match a single engine too"
    assert result["processes_kv_bytes"][0] > 0


def test_tensor_parallel(capsys):
    result = tensor_parallel.main([])
    assert result["max_diff"] < 1e-9, "column + row parallel with a sum must be the same MLP"
    assert result["tokens_equal"] and result["heads"] == (2, 1)
    assert result["workers_alive"] == [False], "close() must stop rank 1"
    assert "TP=2 tokens equal to TP=1: True" in capsys.readouterr().out


def test_call_chain(capsys):
    calls = call_chain.main([])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "LLM.generate"
    assert "    LLMEngine.step" in out and "        Scheduler.schedule" in out and "        ModelRunner.run" in out
    names = [n for _, n in calls]
    assert names.index("Scheduler.schedule") < names.index("ModelRunner.run") < names.index("LLMEngine.postprocess")
    assert (3, "ModelRunner.prepare_prefill") in calls and (3, "ModelRunner.prepare_decode") in calls


def test_request_timeline(tmp_path):
    result = request_timeline.main(["--out", str(tmp_path)])
    counts = result["counts"]
    assert all(counts[s] > 0 for s in ("queued", "prefill", "decode", "stalled", "preempted")), counts
    for row in result["states"].values():
        first = next(s for s in row if s is not None)
        assert first in ("queued", "prefill")            # nothing decodes before its prefill
    assert Path(result["figure"]).stat().st_size > 10_000


def test_paged_vs_contiguous(tmp_path):
    result = paged_vs_contiguous.main(["--out", str(tmp_path)])
    contiguous, paged = result["contiguous"], result["paged"]
    assert contiguous["peak_running"] == paged_vs_contiguous.CAPACITY // paged_vs_contiguous.MAX_LEN
    assert paged["peak_running"] > 2 * contiguous["peak_running"]
    assert paged["utilization"] > 0.8 > 0.5 > contiguous["utilization"]
    assert paged["steps"] < contiguous["steps"]
    assert Path(result["figure"]).is_file()


def test_prefix_caching(capsys):
    result = prefix_caching.main([])
    assert result["equal_hashes"] == [True, False, False]   # the chain carries a change to every later block
    first, *later = result["turns"]
    assert first[1] == 0 and all(cached > 0 for _, cached in later)
    assert all(cached % 16 == 0 and cached < n for n, cached in result["turns"])
    assert "turn 3:" in capsys.readouterr().out


def test_scripts_run_from_the_command_line(tmp_path):
    env = dict(os.environ, INFERLAB_SLIDES_OUT=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "slides_code.batching"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "continuous:" in result.stdout and (tmp_path / "batching.png").is_file()


def _run(args: list[str], **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # as an instructor's shell would be
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", scripts())
def test_every_script_starts_both_ways(name):
    """`python -m slides_code.X` and `python slides_code/X.py` (the second once failed with ModuleNotFoundError)."""
    for args in (["-m", f"slides_code.{name}", "--help"], [f"slides_code/{name}.py", "--help"]):
        result = _run(args)
        assert result.returncode == 0 and "usage:" in result.stdout, (args, result.stderr[-2000:])


def test_a_script_runs_by_path_with_its_output(tmp_path):
    result = _run(["slides_code/minimal_log.py"], INFERLAB_SLIDES_OUT=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "step=0 request_id=0 prompt_len=6 stage=prefill"


def test_listings_file_names_every_script_and_listing():
    """slides_code/listings.md holds each script's listings, verbatim, and an output block after them."""
    assert _make_listings.scripts() == scripts()
    text = (SLIDES / "listings.md").read_text(encoding="utf-8")
    for name in scripts():
        section = text.split(f"## `{name}.py`", 1)[1].split("\n## `", 1)[0]
        for code in listings(SLIDES / f"{name}.py").values():
            assert f"```python\n{code.rstrip()}\n```" in section, f"{name}: a listing differs from the script"
        assert f"**Output** (`python -m slides_code.{name}`):" in section and section.count("```text") == 1


def test_listings_comparison_masks_timings_only():
    text = (SLIDES / "listings.md").read_text(encoding="utf-8")
    steps = next(line for line in text.splitlines() if "static:" in line and "steps" in line)
    slower = re.sub(r"[\d,]+ tok/s", "1 tok/s", steps)
    assert slower != steps and not _make_listings.differences(text, text.replace(steps, slower))
    one_more = re.sub(r"(\d+) steps", lambda m: f"{int(m.group(1)) + 1} steps", steps, count=1)
    assert _make_listings.differences(text, text.replace(steps, one_more)), "a step count is not a timing"
    assert _make_listings.differences(text, text.replace("True", "False", 1))


@pytest.mark.slow
def test_listings_output_matches_a_fresh_run(capsys):
    """Every script is run again as `python -m slides_code.X`; its output must be the committed one, timings aside."""
    assert _make_listings.main(["--check"]) == 0, capsys.readouterr().out[-4000:]
