"""Two lab 5 submissions made from real runs: an honest report and the deliberately wrong one of issue 34.

Both reports are Markdown files in tests/grading/fixtures/lab5/ with `@@name@@` placeholders; what fills
them comes from runs made here with the lab's own scripts (lab5_run.py, lab5_summary.py), read back with
plain csv/json, never with the grader's code, so a verdict the tests expect is the data's, not the
grader's own opinion:

- honest: every experiment of the handout (2-5 in-process here, 3 alternated repeats of each setting, a
  small workload; experiment 1's `inferlab bench --compare hf` files are committed real runs, since
  transformers' generate takes about 20 s per run on a CPU), medians from lab5_summary.py, a real plot,
  planes as lecture 7 gives them, and conclusions that follow from each criterion on the data;
- wrong: one run for all six experiments, `ModelRunner.run` called control plane, preemption put down to
  "the CPU fan", thresholds of 100000 and a 1x1 PNG.

The bench files were made by, from a folder holding the tiny model (`inferlab make-tiny-model runs/tiny`):
    inferlab bench --model runs/tiny --workload quick --device cpu --dtype float32 --compare hf --out bench_quick_N.json
"""
from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import shutil
import struct
import zlib
from pathlib import Path

from labkit.labs import lab_folder

FIXTURES = Path(__file__).parent / "fixtures" / "lab5"
REQUESTS = 8
# (group, lab5_run.py options) of experiments 2-5, in the order one round of repeats runs them.
SETTINGS = [
    *[(f"seqs{n}", ["--max-num-seqs", str(n), "--num-kvcache-blocks", "2048"]) for n in (1, 4, 16, 64)],
    *[(f"kv{n}", ["--max-num-seqs", "8", "--num-kvcache-blocks", str(n)]) for n in (200, 64, 48, 40)],
    ("nochunk", ["--max-num-seqs", "8"]),
    ("chunk64", ["--max-num-seqs", "8", "--chunked-prefill", "--max-num-batched-tokens", "64"]),
    ("chunk256", ["--max-num-seqs", "8", "--chunked-prefill", "--max-num-batched-tokens", "256"]),
    ("shared_on", ["--shared-prefix", "256"]),
    ("shared_off", ["--shared-prefix", "256", "--no-prefix-caching"]),
]
REPEATS = 3
# The call chain a report quotes (in trace order), and what the honest report writes beside each line.
CHAIN = {
    "LLMEngine.step": "输入：无（引擎状态）；输出：本步完成的请求；驱动一步，先调度、再执行、再后处理",
    "Scheduler.schedule": "输入：waiting / running 队列；输出：(seqs, is_prefill)；阶段 3 排队与调度；control plane",
    "ModelRunner.run": "输入：seqs, is_prefill；输出：每个请求的下一个 token；阶段 5 decode；data plane",
    "ModelRunner.prepare_decode": "输入：seqs；输出：input_ids, positions, slot_mapping, block_tables；阶段 5；data plane",
    "ModelRunner._decode_forward": "输入：上面的张量；输出：hidden states；阶段 5；data plane",
    "Qwen3ForCausalLM.forward": "输入：input_ids, positions；输出：hidden states；阶段 5；data plane",
    "Qwen3DecoderLayer.forward": "输入：hidden states；输出：hidden states；阶段 5；data plane",
    "Qwen3Attention.forward": "输入：hidden states；输出：attention 输出；阶段 5，读写 KV cache；data plane",
    "TorchAttentionBackend.forward": "输入：q, k, v 与 AttentionMetadata；输出：attention 输出；阶段 5；data plane",
}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_for_fixture", lab_folder("lab5") / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quiet(call, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return call(*args)


def run_all(folder: Path) -> Path:
    """Experiments 2-5, repeats alternated (A B C ... A B C ...), the bench files, and lab5_summary.py."""
    run = _script("lab5_run")
    common = ["--out", str(folder / "runs"), "--results", str(folder / "results"), "--requests", str(REQUESTS),
              "--warmup", "1"]
    for repeat in range(1, REPEATS + 1):
        for group, options in SETTINGS:
            _quiet(run.main, [f"{group}_{repeat}", *common, *options])
    for path in sorted(FIXTURES.glob("bench_quick_*.json")):
        shutil.copy(path, folder / "runs" / path.name)
    _quiet(_script("lab5_summary").main, ["--results", str(folder / "results"), "--runs", str(folder / "runs")])
    return folder


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def chain_block(calls_file: Path, notes: dict[str, str]) -> str:
    """The first occurrence of each CHAIN name, in trace order, with its indentation, and the note after it."""
    lines, wanted = [], list(CHAIN)
    for text in calls_file.read_text(encoding="utf-8").splitlines():
        name = text.strip().split(" ")[0]
        if wanted and name == wanted[0]:
            lines.append(f"{text.split('    [')[0]}    # {notes[wanted.pop(0)]}")
    assert not wanted, f"the trace lacks {wanted}"
    return "\n".join(lines)


def preemption_block(log: Path, then_step: bool = False) -> str:
    """A PREEMPTED event, the victim's QUEUED, the next STEP and the victim's next SCHEDULED, as logged
    (`then_step`: and the STEP event after that)."""
    lines = log.read_text(encoding="utf-8").splitlines()
    events = [json.loads(text) for text in lines]
    start = next(i for i, e in enumerate(events) if e["event"] == "PREEMPTED")
    victim = events[start]["seq_id"]
    queued = next(i for i in range(start, len(events)) if events[i]["event"] == "QUEUED" and events[i]["seq_id"] == victim)
    step = next(i for i in range(queued, len(events)) if events[i]["event"] == "STEP")
    back = next(i for i in range(step, len(events))
                if events[i]["event"] == "SCHEDULED" and events[i]["seq_id"] == victim)
    picked = [start, queued, step, back]
    if then_step:
        picked.append(next(i for i in range(back, len(events)) if events[i]["event"] == "STEP"))
    return "\n".join(lines[i] for i in picked)


def step_events_block(log: Path, count: int = 3) -> str:
    lines = log.read_text(encoding="utf-8").splitlines()
    return "\n".join([text for text in lines if json.loads(text)["event"] == "STEP"][3:3 + count])


def fill(template: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        template = template.replace(f"@@{key}@@", value)
    assert "@@" not in template, template[template.index("@@"):][:40]
    return template


def plot(summary: Path, out: Path) -> None:
    """decode step time against max_num_seqs, from summary.csv, with its source in the PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = [r for r in rows(summary) if r["group"].startswith("seqs")]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([int(r["max_num_seqs"]) for r in data], [float(r["decode_step_median_ms"]) for r in data], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max_num_seqs")
    ax.set_ylabel("decode step, median (ms)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, metadata={"Source": "results/summary.csv"})
    plt.close(fig)


def _f(value: str, decimals: int = 1) -> str:
    return f"{float(value):.{decimals}f}"


def honest_report(folder: Path) -> str:
    """The honest report of the runs in `folder` (run_all's), its conclusions decided on their data."""
    summary = {r["group"]: r for r in rows(folder / "results" / "summary.csv")}
    steps = rows(folder / "results" / "seqs16_1_steps.csv")[:4]
    env = json.loads((folder / "runs" / "seqs1_1.json").read_text(encoding="utf-8"))["environment"]
    bench = summary["bench_quick"]
    lat = lambda r, what: f"{_f(r[what + '_p50_ms'], 2)} / {_f(r[what + '_p99_ms'], 2)}"
    step16, step4 = float(summary["seqs16"]["decode_step_median_ms"]), float(summary["seqs4"]["decode_step_median_ms"])
    pre200, pre40 = float(summary["kv200"]["preemptions"]), float(summary["kv40"]["preemptions"])
    itl64, itl_none = float(summary["chunk64"]["itl_max_ms"]), float(summary["nochunk"]["itl_max_ms"])
    verdict = lambda holds: "成立" if holds else "被否定（数据不支持；TA 看换成的解释）"
    commands = [f"python assignments/lab5_performance/lab5_run.py {group}_{repeat} {' '.join(options)}"
                for repeat in range(1, REPEATS + 1) for group, options in SETTINGS]
    return fill((FIXTURES / "honest_report.md").read_text(encoding="utf-8"), {
        "machine": f"{env['machine']} {env['processor']}".strip(),
        "versions": f"{env['python']} / {env['torch']}",
        "requests": str(REQUESTS),
        "commands": "\n".join(commands + ["python assignments/lab5_performance/lab5_summary.py"]),
        "chain": chain_block(folder / "runs" / "seqs16_1_calls.txt", CHAIN),
        "step_rows": "\n".join(f"| {s['step']} | {s['batch_size']} | {s['num_tokens']} | {_f(s['duration_ms'], 3)} |"
                               for s in steps),
        "bench_rows": (f"| inferlab | {_f(bench['output_tok_per_s'])} | {lat(bench, 'ttft')} | {lat(bench, 'tpot')} "
                       f"| {bench['n']} |\n| transformers generate | {_f(bench['hf_tok_per_s'])} | - | - | {bench['n']} |"),
        "seqs_rows": "\n".join(f"| {r['max_num_seqs']} | {_f(r['output_tok_per_s'])} | {lat(r, 'ttft')} | "
                               f"{lat(r, 'tpot')} | {_f(r['decode_step_median_ms'], 3)} |"
                               for g, r in summary.items() if g.startswith("seqs")),
        "kv_rows": "\n".join(f"| {r['num_kvcache_blocks']} | {_f(r['preemptions'], 0)} | {_f(r['output_tok_per_s'])} | "
                             f"{lat(r, 'e2e')} |" for g, r in summary.items() if g.startswith("kv")),
        "chunk_rows": "\n".join(f"| {r['max_num_batched_tokens']} | {_f(r['itl_p99_ms'], 2)} / {_f(r['itl_max_ms'], 2)} | "
                                f"{lat(r, 'ttft')} | {_f(r['output_tok_per_s'])} |"
                                for g, r in summary.items() if "chunk" in g),
        "prefix_rows": "\n".join(f"| {'开' if r['prefix_caching'] == 'True' else '关'} | "
                                 f"{float(r['cached_prompt_fraction']) * 100:.1f}% | {lat(r, 'ttft')} | "
                                 f"{_f(r['output_tok_per_s'])} |" for g, r in summary.items() if g.startswith("shared")),
        "preemption": preemption_block(folder / "runs" / "kv40_1.jsonl"),
        "steps": step_events_block(folder / "runs" / "kv40_1.jsonl"),
        "seqs16_step": summary["seqs16"]["decode_step_median_ms"], "seqs4_step": summary["seqs4"]["decode_step_median_ms"],
        "verdict1": verdict(step16 < 4 * step4),
        "kv200_pre": summary["kv200"]["preemptions"], "kv40_pre": summary["kv40"]["preemptions"],
        "verdict2": verdict(pre200 < 1 and pre40 >= 1),
        "chunk64_itl": summary["chunk64"]["itl_max_ms"], "nochunk_itl": summary["nochunk"]["itl_max_ms"],
        "verdict3": verdict(itl64 < itl_none),
    })


def one_pixel_png() -> bytes:
    """A valid 1x1 PNG: a file, not a figure."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff")) + chunk(b"IEND", b""))


def wrong_submission(folder: Path) -> Path:
    """Issue 34's wrong report, on one real run (kv40_1, which preempts) of its own."""
    run = _script("lab5_run")
    _quiet(run.main, ["kv40_1", "--out", str(folder / "runs"), "--results", str(folder / "results"),
                      "--requests", str(REQUESTS), "--warmup", "1", "--max-num-seqs", "8", "--num-kvcache-blocks", "40"])
    row = rows(folder / "results" / "runs.csv")[0]
    notes = {**CHAIN, "ModelRunner.run": "control plane"}          # right everywhere but the one the issue names
    (folder / "figures").mkdir()
    (folder / "figures" / "tput.png").write_bytes(one_pixel_png())
    report = fill((FIXTURES / "wrong_report.md").read_text(encoding="utf-8"), {
        "chain": chain_block(folder / "runs" / "kv40_1_calls.txt", notes),
        "run_row": f"| kv40_1 | {row['preemptions']} | {_f(row['output_tok_per_s'])} |",
        "preemption": preemption_block(folder / "runs" / "kv40_1.jsonl", then_step=True),
        "tok": _f(row["output_tok_per_s"]),
    })
    (folder / "report.md").write_text(report, encoding="utf-8")
    return folder


def honest_submission(runs: Path, folder: Path) -> Path:
    """The honest report and its evidence: a copy of run_all's folder, the plot, report.md."""
    shutil.copytree(runs, folder)
    plot(folder / "results" / "summary.csv", folder / "figures" / "decode_step_ms.png")
    (folder / "report.md").write_text(honest_report(folder), encoding="utf-8")
    return folder
