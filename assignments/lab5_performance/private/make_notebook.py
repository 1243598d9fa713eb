"""Build the lab 5 nbgrader SOURCE notebook, source/lab5_analysis.ipynb, and (on request) its data.

INSTRUCTORS ONLY. This script holds the reference answers and the hidden
tests' expected values: never hand it (or this folder's `source/` notebook)
to students. Students get what `nbgrader generate_assignment` makes of
`source/`: the notebook with solutions and hidden tests stripped, and the two
lifecycle logs beside it.

The notebook asks students to compute latency metrics, throughput and
per-step times from two lifecycle logs of the reference engine (same
workload, same machine, only `max_num_seqs` differs), and to explain the
difference in writing. It needs only json, math and numpy (and matplotlib
for one figure), never `reference`, so it runs wherever the logs are.

nbgrader cells (metadata schema 3):
- read-only instruction and setup cells: locked, not graded;
- answer cells: `solution: true`, the reference answer between
  `### BEGIN SOLUTION` / `### END SOLUTION` (nbgrader replaces it by a stub);
- autograded test cells: `grade: true`, locked, with points; visible asserts
  first, then exact expected values between `### BEGIN HIDDEN TESTS` /
  `### END HIDDEN TESTS` (removed from the student copy, restored by
  `nbgrader autograde`). Those values are computed here with
  `reference.metrics`, an implementation independent of the answers;
- one manually graded Markdown answer (`grade` and `solution` both true).

Usage (from the repository root):
    python assignments/lab5_performance/private/make_notebook.py           # write the notebook from the logs
    python assignments/lab5_performance/private/make_notebook.py --check   # exit 1 if the notebook is stale
    python assignments/lab5_performance/private/make_notebook.py --logs    # re-run the engine (tiny model, CPU),
                                                                    # rewrite the logs, then the notebook
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import textwrap
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "source"
NOTEBOOK = SOURCE / "lab5_analysis.ipynb"
LOGS = {"A": SOURCE / "run_a.jsonl", "B": SOURCE / "run_b.jsonl"}
RUNS = SOURCE / "runs.json"

# The one setting the two runs differ in; everything else is shared.
MAX_NUM_SEQS = {"A": 4, "B": 16}
SHARED = dict(device="cpu", dtype="float32", kvcache_block_size=16, num_kvcache_blocks=128,
              max_num_batched_tokens=4096, enable_prefix_caching=False)
NUM_REQUESTS = 16
WORKLOAD_SEED = 5
HICCUP_FACTOR = 10     # a decode step slower than 10x the run's median is a stall (a full GC, another process)
MAX_ATTEMPTS = 5

POINTS = {"q1": 3, "q2": 3, "q3": 2, "q4": 3, "q5": 4}


# --------------------------------------------------------------------------- the data

def workload():
    """16 requests: random token ids, prompt 16..96 tokens, output 8..32 tokens (ignore_eos), all seeded."""
    import numpy as np
    from reference import SamplingParams
    rng = np.random.default_rng(WORKLOAD_SEED)
    prompts = [rng.integers(0, 1000, size=int(rng.integers(16, 97))).tolist() for _ in range(NUM_REQUESTS)]
    outputs = rng.integers(8, 33, size=NUM_REQUESTS).tolist()
    return prompts, [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True) for n in outputs]


def _hiccup(events) -> str | None:
    """A decode step far slower than the run's typical one: the machine, not the engine (None if there is none).

    The shipped logs are teaching data about batching; a stall caused by another
    process on a shared machine would dominate their tail percentiles, so such a
    run is repeated (runs.json records that this filter was applied).
    """
    import statistics
    steps = [e for e in events if e["event"] == "STEP"]
    decode = [(b["time"] - a["time"], a["step"]) for a, b in zip(steps, steps[1:]) if not a["is_prefill"]]
    typical = statistics.median(d for d, _ in decode)
    worst, step = max(decode)
    return f"decode step {step} took {worst * 1e3:.1f} ms, median {typical * 1e3:.1f} ms" \
        if worst > HICCUP_FACTOR * typical else None


def make_logs() -> None:
    """Run the workload twice on the tiny model (A, then B) and write each run's lifecycle log."""
    import torch
    import transformers
    from courseware.tiny_model import ensure_tiny_model
    from reference import LLM

    model = str(ensure_tiny_model())
    prompts, params = workload()
    # One throwaway engine first: the process's one-time costs (allocator, kernels) stay out of both logs.
    LLM(model, max_num_seqs=4, **SHARED).generate(prompts[:4], params[:4], use_tqdm=False)
    for run, path in LOGS.items():
        for attempt in range(1, MAX_ATTEMPTS + 1):
            llm = LLM(model, max_num_seqs=MAX_NUM_SEQS[run], **SHARED)
            llm.generate(prompts, params, use_tqdm=False)
            hiccup = _hiccup(llm.log.events)
            if hiccup is None:
                break
            print(f"run {run}, attempt {attempt}: {hiccup}; running it again", file=sys.stderr)
        else:
            raise RuntimeError(f"run {run}: the machine is too noisy ({hiccup}); try again on a quiet machine")
        path.write_text("".join(json.dumps(e) + "\n" for e in llm.log.events), encoding="utf-8")
        print(f"wrote {path.relative_to(HERE.parents[2])} ({len(llm.log.events)} events)")
    RUNS.write_text(json.dumps({
        "workload": {"requests": NUM_REQUESTS, "prompt_tokens": "uniform 16..96", "output_tokens": "uniform 8..32",
                     "ignore_eos": True, "arrival": "all submitted at once (offline)", "seed": WORKLOAD_SEED},
        "model": "built-in tiny Qwen3 (inferlab make-tiny-model, seed 0)",
        "shared_settings": SHARED,
        "runs": {run: {"log": LOGS[run].name, "max_num_seqs": MAX_NUM_SEQS[run]} for run in LOGS},
        "filter": f"a run with a decode step slower than {HICCUP_FACTOR}x its median decode step was run again",
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__, "machine": platform.machine(),
                        "cpu_threads": torch.get_num_threads()},
    }, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def expected_values() -> dict:
    """What a correct answer computes from the shipped logs, by reference.metrics (not by the answers below)."""
    import statistics
    from reference.metrics import distribution, read_log, request_metrics, step_metrics

    out = {}
    for run, path in LOGS.items():
        events = read_log(path)
        metrics = request_metrics(events)
        ids = sorted(metrics)
        arrived = min(e["time"] for e in events if e["event"] == "ARRIVED")
        finished = max(e["time"] for e in events if e["event"] == "FINISHED")
        tokens = sum(m.num_output_tokens for m in metrics.values())
        steps = step_metrics(events)
        by_batch: dict[int, list[float]] = {}
        for this, following in zip(steps, steps[1:]):
            if not this.is_prefill:
                by_batch.setdefault(this.batch_size, []).append(following.time - this.time)
        out[run] = {
            "ids": ids,
            "sample": {i: {"queue": metrics[i].queue_time, "ttft": metrics[i].ttft, "tpot": metrics[i].tpot,
                           "e2e": metrics[i].e2e, "output_tokens": metrics[i].num_output_tokens}
                       for i in (ids[0], ids[len(ids) // 2], ids[-1])},
            "ttft_sum": sum(metrics[i].ttft for i in ids),
            "ttft": distribution(m.ttft for m in metrics.values()),
            "tpot": distribution(m.tpot for m in metrics.values() if m.tpot is not None),
            "throughput": tokens / (finished - arrived),
            "step_times": {b: statistics.median(v) for b, v in sorted(by_batch.items())},
        }
    out["speedup"] = out["B"]["throughput"] / out["A"]["throughput"]
    return out


def answer_facts(exp: dict) -> dict:
    """The measurements the written reference answer cites; each claim it makes is checked here.

    If freshly made logs no longer support the answer (a noisy machine), building
    the notebook fails instead of shipping an answer the data contradicts.
    """
    import statistics
    from reference.metrics import read_log, request_metrics, step_metrics

    facts: dict = {}
    itl = {"adjacent": [], "across_prefill": []}
    for run, path in LOGS.items():
        events = read_log(path)
        metrics = request_metrics(events)
        facts[f"{run.lower()}_prefill_steps"] = sum(1 for s in step_metrics(events) if s.is_prefill)
        facts[f"{run.lower()}_ttft_min"] = min(m.ttft for m in metrics.values())
        waited = [m for m in metrics.values() if m.queue_time > 1e-3]
        facts[f"{run.lower()}_queue_share_min"] = min((m.queue_time / m.ttft for m in waited), default=None)
        facts[f"{run.lower()}_queue_max"] = max(m.queue_time for m in metrics.values())
        if run == "A":
            tokens: dict[int, list[tuple[int, float]]] = {}
            for e in events:
                if e["event"] in ("FIRST_TOKEN", "TOKEN"):
                    tokens.setdefault(e["seq_id"], []).append((e["step"], e["time"]))
            for seq in tokens.values():
                for (s0, t0), (s1, t1) in zip(seq, seq[1:]):
                    itl["adjacent" if s1 - s0 == 1 else "across_prefill"].append(t1 - t0)
    facts["itl_adjacent"] = statistics.median(itl["adjacent"])
    facts["itl_across_prefill"] = statistics.median(itl["across_prefill"])
    facts["t_big_a"] = exp["A"]["step_times"][MAX_NUM_SEQS["A"]]
    facts["t_big_b"] = exp["B"]["step_times"][MAX_NUM_SEQS["B"]]
    facts["step_ratio"] = facts["t_big_b"] / facts["t_big_a"]
    claims = {
        "B has the higher throughput": exp["speedup"] > 1.5,
        "a batch-16 decode step costs far less than 4 batch-4 steps": facts["step_ratio"] < 2.5,
        "queueing is most of a waiting request's TTFT in A": (facts["a_queue_share_min"] or 0) > 0.7,
        "nobody queues in B": facts["b_queue_max"] < 0.005,
        "B's fastest first token is later than A's": facts["b_ttft_min"] > facts["a_ttft_min"],
        "A interleaves prefill steps, B has one": facts["a_prefill_steps"] > 1 and facts["b_prefill_steps"] == 1,
        "ITLs across a prefill step are longer": facts["itl_across_prefill"] > facts["itl_adjacent"],
    }
    broken = [claim for claim, holds in claims.items() if not holds]
    if broken:
        raise RuntimeError(f"the logs do not support the reference answer ({'; '.join(broken)}): "
                           "re-make them on a quiet machine (--logs)")
    return facts


# --------------------------------------------------------------------------- cells

def _meta(grade_id: str, *, grade: bool = False, solution: bool = False, locked: bool = False,
          points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _src(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def cells(exp: dict) -> list[tuple[str, str, dict]]:
    """(kind, source, metadata) of every cell, in order."""
    a, b = exp["A"], exp["B"]
    out: list[tuple[str, str, dict]] = []

    def md(grade_id, text):
        out.append(("markdown", _src(text), _meta(grade_id, locked=True)))

    def setup(grade_id, text):
        out.append(("code", _src(text), _meta(grade_id, locked=True)))

    def answer(grade_id, text):
        out.append(("code", _src(text), _meta(grade_id, solution=True)))

    def tests(grade_id, points, visible, hidden):
        body = _src(visible) + "\n\n### BEGIN HIDDEN TESTS\n" + _src(hidden) + "\n### END HIDDEN TESTS"
        out.append(("code", body, _meta(grade_id, grade=True, locked=True, points=points)))

    def plain(text):
        out.append(("code", _src(text), {}))

    md("intro", f"""
        # Lab 5 · 分析 notebook：从 lifecycle log 读出性能

        两份 lifecycle log 来自 **同一份 workload**（{NUM_REQUESTS} 个请求，prompt 16–96 token、输出 8–32 token，
        `ignore_eos`，一次性全部提交，即 offline）、同一台机器、同一个 tiny model（CPU），**唯一的区别** 是
        `max_num_seqs`：run A 为 {MAX_NUM_SEQS['A']}，run B 为 {MAX_NUM_SEQS['B']}。完整设置见 `runs.json`。

        每行一个事件（JSON），每个事件都有 `event`、`seq_id`、`step`、`time`（秒，单调时钟）：
        `ARRIVED`（`prompt_len`）→ `QUEUED` → `SCHEDULED`（`is_prefill`、`num_new_tokens`…）→ `FIRST_TOKEN` →
        `TOKEN`… → `FINISHED`（`reason`、`num_output_tokens`）→ `FREED`；被 preempt 的请求会有 `PREEMPTED` 和第二个
        `QUEUED`。`STEP` 事件（`seq_id` 为 `null`）每步一个，在调度之后、forward 之前写出，带 `is_prefill`、
        `batch_size`、`num_tokens`、`num_running`、`num_waiting`、`kv_blocks_used`、`kv_blocks_total`。

        **规则**：只在标着 `YOUR CODE HERE` 的格子里写代码，不要改函数名和参数；只用 Python 标准库、`numpy`
        和 `matplotlib`（评分环境里没有 `reference` 包）。交之前 **Kernel → Restart & Run All**，确认没有报错。
        可见的 `assert` 只是一部分检查，评分时还有隐藏的检查（同样的函数，精确到浮点误差的期望值）。
        """)

    setup("setup", """
        import json
        import math

        import numpy as np


        def read_jsonl(path):
            \"\"\"One dict per non-empty line of a JSON Lines file.\"\"\"
            with open(path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]


        runs = json.load(open("runs.json", encoding="utf-8"))
        log_a = read_jsonl(runs["runs"]["A"]["log"])
        log_b = read_jsonl(runs["runs"]["B"]["log"])
        for name, log in (("A", log_a), ("B", log_b)):
            kinds = {}
            for e in log:
                kinds[e["event"]] = kinds.get(e["event"], 0) + 1
            print(f"run {name}: max_num_seqs={runs['runs'][name]['max_num_seqs']}, {len(log)} events: {kinds}")
        """)

    md("q1_text", f"""
        ## 问题 1（{POINTS['q1']} 分）：每个请求的延迟

        实现 `request_latencies(events)`：返回 `{{seq_id: {{...}}}}`，每个请求一个字典，键为
        `"queue"`、`"ttft"`、`"tpot"`、`"e2e"`（秒）和 `"output_tokens"`（整数）。定义（vLLM 的 metrics 定义，
        也是课程引擎 `metrics.py` 的定义）：

        | 指标 | 定义 |
        | --- | --- |
        | queue | 第一个 `SCHEDULED` − `ARRIVED` |
        | ttft | `FIRST_TOKEN` − `ARRIVED` |
        | tpot | (`FINISHED` − `FIRST_TOKEN`) / (输出 token 数 − 1)；输出少于 2 个 token 时为 `None` |
        | e2e | `FINISHED` − `ARRIVED` |
        | output_tokens | 该请求的 `FIRST_TOKEN` 和 `TOKEN` 事件个数 |

        每个时间点都取该事件 **第一次** 出现的时刻（被 preempt 的请求会被调度不止一次）；缺少的事件让对应指标为
        `None`。`STEP` 事件不属于任何请求，忽略它。
        """)

    answer("q1_answer", """
        def request_latencies(events):
            ### BEGIN SOLUTION
            first = {}      # (seq_id, event) -> time of the first occurrence
            tokens = {}     # seq_id -> number of token events
            for e in events:
                if e["event"] == "STEP":
                    continue
                first.setdefault((e["seq_id"], e["event"]), e["time"])
                if e["event"] in ("FIRST_TOKEN", "TOKEN"):
                    tokens[e["seq_id"]] = tokens.get(e["seq_id"], 0) + 1

            def span(seq_id, start, end):
                t0, t1 = first.get((seq_id, start)), first.get((seq_id, end))
                return None if t0 is None or t1 is None else t1 - t0

            out = {}
            for seq_id in sorted({key[0] for key in first}):
                n = tokens.get(seq_id, 0)
                decode = span(seq_id, "FIRST_TOKEN", "FINISHED")
                out[seq_id] = {
                    "queue": span(seq_id, "ARRIVED", "SCHEDULED"),
                    "ttft": span(seq_id, "ARRIVED", "FIRST_TOKEN"),
                    "tpot": decode / (n - 1) if n >= 2 and decode is not None else None,
                    "e2e": span(seq_id, "ARRIVED", "FINISHED"),
                    "output_tokens": n,
                }
            return out
            ### END SOLUTION
        """)

    sample_a = {k: v for k, v in a["sample"].items()}
    sample_b = {k: v for k, v in b["sample"].items()}
    tests("q1_tests", POINTS["q1"], """
        # A hand-made log: seq 0 (5 tokens), seq 1 (2 tokens), seq 2 (1 token, stopped at once).
        def ev(name, seq_id, step, time, **fields):
            return {"event": name, "seq_id": seq_id, "step": step, "time": time, **fields}

        MINI = [
            ev("ARRIVED", 0, 0, 1.0, prompt_len=4), ev("QUEUED", 0, 0, 1.0, reason="new"),
            ev("ARRIVED", 2, 0, 1.0, prompt_len=3), ev("QUEUED", 2, 0, 1.0, reason="new"),
            ev("ARRIVED", 1, 0, 1.25, prompt_len=5), ev("QUEUED", 1, 0, 1.25, reason="new"),
            ev("SCHEDULED", 0, 0, 1.5, is_prefill=True), ev("STEP", None, 0, 1.5, is_prefill=True, batch_size=1),
            ev("FIRST_TOKEN", 0, 0, 1.625, index=0),
            ev("SCHEDULED", 2, 1, 2.0, is_prefill=True), ev("SCHEDULED", 1, 1, 2.0, is_prefill=True),
            ev("STEP", None, 1, 2.0, is_prefill=True, batch_size=2),
            ev("FIRST_TOKEN", 2, 1, 2.125, index=0), ev("FINISHED", 2, 1, 2.125, reason="stop", num_output_tokens=1),
            ev("FREED", 2, 1, 2.125, blocks_freed=1), ev("FIRST_TOKEN", 1, 1, 2.125, index=0),
            ev("SCHEDULED", 0, 2, 2.5, is_prefill=False), ev("SCHEDULED", 1, 2, 2.5, is_prefill=False),
            ev("STEP", None, 2, 2.5, is_prefill=False, batch_size=2),
            ev("TOKEN", 0, 2, 2.625, index=1), ev("TOKEN", 1, 2, 2.625, index=1),
            ev("FINISHED", 1, 2, 2.625, reason="length", num_output_tokens=2), ev("FREED", 1, 2, 2.625, blocks_freed=2),
            ev("SCHEDULED", 0, 3, 3.25, is_prefill=False), ev("STEP", None, 3, 3.25, is_prefill=False, batch_size=1),
            ev("TOKEN", 0, 3, 3.375, index=2),
            ev("SCHEDULED", 0, 4, 3.5, is_prefill=False), ev("STEP", None, 4, 3.5, is_prefill=False, batch_size=1),
            ev("TOKEN", 0, 4, 3.625, index=3),
            ev("SCHEDULED", 0, 5, 4.0, is_prefill=False), ev("STEP", None, 5, 4.0, is_prefill=False, batch_size=1),
            ev("TOKEN", 0, 5, 4.125, index=4), ev("FINISHED", 0, 5, 4.125, reason="length", num_output_tokens=5),
            ev("FREED", 0, 5, 4.125, blocks_freed=2),
        ]

        mini = request_latencies(MINI)
        assert sorted(mini) == [0, 1, 2], f"one entry per request (STEP is no request): got keys {sorted(mini)}"
        assert mini[0] == {"queue": 0.5, "ttft": 0.625, "tpot": 0.625, "e2e": 3.125, "output_tokens": 5}, mini[0]
        assert mini[1] == {"queue": 0.75, "ttft": 0.875, "tpot": 0.5, "e2e": 1.375, "output_tokens": 2}, mini[1]
        assert mini[2]["tpot"] is None, "one output token: TPOT is undefined (None), not 0"
        assert mini[2]["ttft"] == 1.125 and mini[2]["output_tokens"] == 1, mini[2]

        lat_a, lat_b = request_latencies(log_a), request_latencies(log_b)
        assert len(lat_a) == len(lat_b) == 16, (len(lat_a), len(lat_b))
        for lat in (lat_a, lat_b):
            for seq_id, m in lat.items():
                assert 0 <= m["queue"] <= m["ttft"] <= m["e2e"], (seq_id, m)
        print("visible checks passed")
        """, f"""
        def _close(x, y):
            return (x is None and y is None) or (x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12))

        _lat = {{"A": request_latencies(log_a), "B": request_latencies(log_b)}}
        assert sorted(_lat["A"]) == {a['ids']!r} and sorted(_lat["B"]) == {b['ids']!r}
        _expected = {{"A": {sample_a!r}, "B": {sample_b!r}}}
        for _run, _seqs in _expected.items():
            for _seq_id, _metrics in _seqs.items():
                for _key, _value in _metrics.items():
                    assert _close(_lat[_run][_seq_id][_key], _value), (_run, _seq_id, _key, _lat[_run][_seq_id][_key], _value)
        assert math.isclose(sum(m["ttft"] for m in _lat["A"].values()), {a['ttft_sum']!r}, rel_tol=1e-9)
        assert math.isclose(sum(m["ttft"] for m in _lat["B"].values()), {b['ttft_sum']!r}, rel_tol=1e-9)
        """)

    md("q2_text", f"""
        ## 问题 2（{POINTS['q2']} 分）：百分位数

        1. 不用 `np.percentile` / `np.quantile`，实现 `percentile(values, p)`：线性插值（numpy 的默认方法）。
           把 n 个值排序为 v[0..n-1]，第 p 百分位落在位置 (n − 1)·p/100，在它两侧的两个值之间线性插值。
           空列表返回 `None`。
        2. 实现 `summary(latencies)`：对 `request_latencies` 的结果，返回
           `{{"ttft": {{"p50": .., "p90": .., "p99": ..}}, "tpot": {{...}}}}`，值为 `None` 的请求不参与。
        """)

    answer("q2_answer", """
        def percentile(values, p):
            ### BEGIN SOLUTION
            data = sorted(values)
            if not data:
                return None
            pos = (len(data) - 1) * p / 100
            lo = math.floor(pos)
            hi = min(lo + 1, len(data) - 1)
            return data[lo] + (data[hi] - data[lo]) * (pos - lo)
            ### END SOLUTION


        def summary(latencies):
            ### BEGIN SOLUTION
            out = {}
            for key in ("ttft", "tpot"):
                values = [m[key] for m in latencies.values() if m[key] is not None]
                out[key] = {f"p{p}": percentile(values, p) for p in (50, 90, 99)}
            return out
            ### END SOLUTION
        """)

    tests("q2_tests", POINTS["q2"], """
        rng = np.random.default_rng(0)
        for n in (1, 2, 7, 32, 101):
            data = rng.exponential(1.0, size=n).tolist()
            for p in (0, 10, 50, 90, 99, 100):
                assert math.isclose(percentile(data, p), float(np.percentile(data, p)), rel_tol=1e-12), (n, p)
        assert percentile([], 50) is None
        assert percentile([3.0, 1.0, 2.0], 50) == 2.0, "sort first"
        s = summary(request_latencies(log_a))
        assert set(s) == {"ttft", "tpot"} and set(s["ttft"]) == {"p50", "p90", "p99"}, s
        assert s["ttft"]["p50"] <= s["ttft"]["p90"] <= s["ttft"]["p99"], s
        print("visible checks passed")
        """, f"""
        _sa, _sb = summary(request_latencies(log_a)), summary(request_latencies(log_b))
        for _got, _exp in ((_sa, {a['ttft']!r}), (_sb, {b['ttft']!r})):
            for _p in ("p50", "p90", "p99"):
                assert math.isclose(_got["ttft"][_p], _exp[_p], rel_tol=1e-9), ("ttft", _p, _got["ttft"][_p], _exp[_p])
        for _got, _exp in ((_sa, {a['tpot']!r}), (_sb, {b['tpot']!r})):
            for _p in ("p50", "p90", "p99"):
                assert math.isclose(_got["tpot"][_p], _exp[_p], rel_tol=1e-9), ("tpot", _p, _got["tpot"][_p], _exp[_p])
        """)

    plain("""
        # Not graded: the two runs side by side, and the TTFT distributions.
        import matplotlib.pyplot as plt

        lat = {"A": request_latencies(log_a), "B": request_latencies(log_b)}
        for name in ("A", "B"):
            s = summary(lat[name])
            print(f"run {name}: TTFT p50/p90/p99 = " + " / ".join(f"{s['ttft'][p] * 1e3:7.2f}" for p in ("p50", "p90", "p99"))
                  + " ms;  TPOT p50/p90/p99 = " + " / ".join(f"{s['tpot'][p] * 1e3:6.2f}" for p in ("p50", "p90", "p99")) + " ms")

        fig, ax = plt.subplots(figsize=(6, 3.2))
        for name in ("A", "B"):
            ttft = np.sort([m["ttft"] for m in lat[name].values()]) * 1e3
            ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post",
                    label=f"run {name} (max_num_seqs={runs['runs'][name]['max_num_seqs']})")
        ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="TTFT CDF")
        ax.legend()
        plt.tight_layout()
        plt.show()
        """)

    md("q3_text", f"""
        ## 问题 3（{POINTS['q3']} 分）：吞吐

        实现 `throughput(events)`：输出 token 总数 / (最后一个 `FINISHED` 的时刻 − 第一个 `ARRIVED` 的时刻)，
        单位 output tok/s。然后令 `speedup = throughput(log_b) / throughput(log_a)`。
        """)

    answer("q3_answer", """
        def throughput(events):
            ### BEGIN SOLUTION
            tokens = sum(1 for e in events if e["event"] in ("FIRST_TOKEN", "TOKEN"))
            start = min(e["time"] for e in events if e["event"] == "ARRIVED")
            end = max(e["time"] for e in events if e["event"] == "FINISHED")
            return tokens / (end - start)
            ### END SOLUTION


        ### BEGIN SOLUTION
        speedup = throughput(log_b) / throughput(log_a)
        ### END SOLUTION
        print(f"A: {throughput(log_a):8.1f} tok/s   B: {throughput(log_b):8.1f} tok/s   B/A = {speedup:.2f}x")
        """)

    tests("q3_tests", POINTS["q3"], """
        assert math.isclose(throughput(MINI), 8 / 3.125), throughput(MINI)
        assert throughput(log_a) > 0 and throughput(log_b) > 0
        assert math.isclose(speedup, throughput(log_b) / throughput(log_a)), speedup
        print("visible checks passed")
        """, f"""
        assert math.isclose(throughput(log_a), {a['throughput']!r}, rel_tol=1e-9), throughput(log_a)
        assert math.isclose(throughput(log_b), {b['throughput']!r}, rel_tol=1e-9), throughput(log_b)
        assert math.isclose(speedup, {exp['speedup']!r}, rel_tol=1e-9), speedup
        """)

    md("q4_text", f"""
        ## 问题 4（{POINTS['q4']} 分）：每步耗时与 batch 大小

        `STEP` 事件在每一步调度之后写出，所以相邻两个 `STEP` 的时间差就是一整步（forward、采样、postprocess、
        下一次调度）的耗时。实现 `decode_step_times(events)`：只看 decode 步（`is_prefill` 为假），
        一步的耗时 = 下一个 `STEP` 的时刻 − 这一步 `STEP` 的时刻（最后一步没有下一个，跳过）；返回
        `{{batch_size: 该 batch 大小的 decode 步耗时的中位数（秒）}}`。

        然后看看：batch 大小变成 4 倍时，一个 decode 步变慢了多少？这对问题 3 的 `speedup` 意味着什么？
        """)

    answer("q4_answer", """
        def decode_step_times(events):
            ### BEGIN SOLUTION
            steps = [e for e in events if e["event"] == "STEP"]
            durations = {}
            for this, following in zip(steps, steps[1:]):
                if not this["is_prefill"]:
                    durations.setdefault(this["batch_size"], []).append(following["time"] - this["time"])
            return {batch: float(np.median(times)) for batch, times in sorted(durations.items())}
            ### END SOLUTION
        """)

    tests("q4_tests", POINTS["q4"], """
        assert decode_step_times(MINI) == {1: 0.375, 2: 0.75}, decode_step_times(MINI)
        for log, limit in ((log_a, 4), (log_b, 16)):
            times = decode_step_times(log)
            assert times and all(1 <= b <= limit for b in times), times
            assert all(t > 0 for t in times.values()), times
        print("visible checks passed")
        """, f"""
        for _log, _exp in ((log_a, {a['step_times']!r}), (log_b, {b['step_times']!r})):
            _got = decode_step_times(_log)
            assert sorted(_got) == sorted(_exp), (sorted(_got), sorted(_exp))
            for _b, _t in _exp.items():
                assert math.isclose(_got[_b], _t, rel_tol=1e-9), (_b, _got[_b], _t)
        """)

    plain("""
        # Not graded: decode step time against batch size, both runs.
        for name, log in (("A", log_a), ("B", log_b)):
            times = decode_step_times(log)
            print(f"run {name}: " + ", ".join(f"batch {b}: {t * 1e3:.2f} ms" for b, t in times.items()))
        """)

    f = answer_facts(exp)
    ms = lambda seconds: f"{seconds * 1e3:.1f} ms"
    md("q5_text", f"""
        ## 问题 5（{POINTS['q5']} 分，人工评分）：解释

        用上面算出的数字回答（300 字以内）：run B 相对 run A，吞吐、TTFT 的 P99、TPOT 各变了多少，为什么？
        每一个解释都要是 **可否定的**：写明 "如果这个解释不对，应该看到什么测量结果"，并用本 notebook
        里已有的数字（或你再算的数字）检验它。只写 "因为 batch 更大所以更快" 不得分。
        """)

    out.append(("markdown", _src(f"""
        **参考答案**（评分要点：三个量的方向和大小都来自数据；每个解释给出可否定的预测，并用数据检验）

        - **吞吐**：B 是 A 的 {exp['speedup']:.2f} 倍（{a['throughput']:.0f} → {b['throughput']:.0f} tok/s）。
          解释：tiny model 在 CPU 上，一个 decode 步的耗时大部分是与 batch 大小无关的固定开销（Python 调度、
          输入准备、每层的算子调用），所以一步算 16 个 token 和算 4 个差不多快。可否定的预测：若耗时与 batch
          成正比，B 里 batch 16 的 decode 步应约为 A 里 batch 4 的 4 倍；实测 {ms(f['t_big_b'])} 对
          {ms(f['t_big_a'])}（{f['step_ratio']:.2f} 倍），解释成立。
        - **TTFT P99**：{ms(a['ttft']['p99'])} → {ms(b['ttft']['p99'])}。A 只有 {MAX_NUM_SEQS['A']} 个位置，
          其余请求排队，等前面的请求结束才能进入。可否定的预测：A 里排过队的请求，TTFT 的大部分是 queue time；
          实测这些请求 queue / TTFT 最小为 {f['a_queue_share_min']:.2f}，而 B 的 queue time 全部小于
          {ms(f['b_queue_max'])}。反过来，B 的最小 TTFT（{ms(f['b_ttft_min'])}）比 A 的（{ms(f['a_ttft_min'])}）
          大：B 的第一步一次 prefill 了全部 {NUM_REQUESTS} 个 prompt，最早的请求要等这一大步做完。
        - **TPOT**：P50 {ms(a['tpot']['p50'])} → {ms(b['tpot']['p50'])}。TPOT 是一个请求在 decode 阶段平均每步等了多久，
          由两部分组成：decode 步本身（B 的 batch 大，每步 {ms(f['t_big_b'])}，A 为 {ms(f['t_big_a'])}）和插在 decode
          之间的 prefill 步。引擎是 prefill-first：A 里每有一个请求结束、新请求进入，就插入一个 prefill 步，正在 decode
          的请求都要等它；A 有 {f['a_prefill_steps']} 个 prefill 步，B 只有 {f['b_prefill_steps']} 个。可否定的预测：
          A 里跨过 prefill 步的 ITL 应明显大于相邻 decode 步之间的 ITL；实测中位数 {ms(f['itl_across_prefill'])} 对
          {ms(f['itl_adjacent'])}。若二者相同，A 的 TPOT 就应等于它的 decode 步耗时，差别要另找原因（例如机器负载在两次运行
          之间变了：这正是公平比较要交替运行的原因）。
        """), _meta("q5_answer", grade=True, solution=True, points=POINTS["q5"])))
    return out


def build_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    for i, (kind, source, metadata) in enumerate(cells(expected_values())):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make(source, id=f"lab5-{i:03d}", metadata=metadata))
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the notebook differs from what would be written")
    mode.add_argument("--logs", action="store_true", help="re-run the engine and rewrite the logs first")
    args = parser.parse_args(argv)
    if args.logs:
        make_logs()
    text = render(build_notebook())
    if args.check:
        if not NOTEBOOK.is_file() or NOTEBOOK.read_text(encoding="utf-8") != text:
            print(f"{NOTEBOOK.name} is stale: run python {Path(__file__).relative_to(HERE.parents[2])}",
                  file=sys.stderr)
            return 1
        return 0
    NOTEBOOK.write_text(text, encoding="utf-8")
    print(f"wrote {NOTEBOOK.relative_to(HERE.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
