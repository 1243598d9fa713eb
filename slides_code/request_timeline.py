"""Slide "请求时间线": queued / prefill / decode / stalled / preempted per request, from the lifecycle log.

    python -m slides_code.request_timeline [--out DIR]     # writes request_timeline.png
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

import random

from slides_code._common import figure_path, model_dir, out_dir, parse_args, setup_torch

COLORS = {"queued": "#bbbbbb", "prefill": "#d62728", "decode": "#1f77b4", "stalled": "#ffbf00",
          "preempted": "#9467bd"}


# --- slide: 从 lifecycle log 还原状态（1）：一步的事件 -> 状态 ---
def advance(state, names):
    """(state after this step, what the timeline shows for it), given the step's events {name: event}."""
    shown = None
    if "ARRIVED" in names:
        state = "queued"
    if "SCHEDULED" in names:
        state, shown = "running", ("prefill" if names["SCHEDULED"]["is_prefill"] else "decode")
    elif "PREEMPTED" in names:
        state = "preempted"
    if shown is None and state is not None:
        shown = "stalled" if state == "running" else state
    return (None if "FINISHED" in names else state), shown
# --- end slide ---


# --- slide: 从 lifecycle log 还原状态（2）：每个请求、每一步 ---
def states(events, num_steps):
    """{seq_id: [state or None per step]}; state after the step's events."""
    table = {}
    for seq_id in sorted({e["seq_id"] for e in events if e["seq_id"] is not None}):
        evs = [e for e in events if e["seq_id"] == seq_id]
        row, state = [], None
        for step in range(num_steps):
            state, shown = advance(state, {e["event"]: e for e in evs if e["step"] == step})
            row.append(shown)
        table[seq_id] = row
    return table
# --- end slide ---


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, __doc__.splitlines()[0])
    out = out_dir(args)
    setup_torch()
    from reference import LLM, SamplingParams
    from reference.metrics import check_lifecycle
    llm = LLM(model_dir(), device="auto", max_num_seqs=4, kvcache_block_size=16, num_kvcache_blocks=12,
              enable_prefix_caching=False)
    rng = random.Random(0)
    arrivals = {s: [([rng.randrange(1000) for _ in range(rng.randint(20, 40))],
                     SamplingParams(temperature=0.0, max_tokens=rng.randint(30, 60), ignore_eos=True))
                    for _ in range(2)] for s in (0, 6, 12, 30)}
    while arrivals or not llm.is_finished():
        for prompt, params in arrivals.pop(llm.step_index, []):
            llm.add_request(prompt, params)
        if llm.is_finished():
            llm.step_index = min(arrivals)    # nothing to run: jump to the next arrival
            continue
        llm.step()
    assert check_lifecycle(llm.log.events) == []
    table = states(llm.log.events, llm.step_index)

    figure = figure_path(out, "request_timeline.png")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(11, 3.6))
    for seq_id, row in table.items():
        for step, state in enumerate(row):
            if state is not None:
                ax.barh(seq_id, 1, left=step, color=COLORS[state], edgecolor="none")
    ax.set(xlabel="engine step", ylabel="request id", title="per-request timeline")
    ax.invert_yaxis()
    fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()], labels=list(COLORS),
               ncols=5, loc="lower center")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(figure, dpi=150)
    plt.close(fig)
    counts = {s: sum(row.count(s) for row in table.values()) for s in COLORS}
    print("request-steps per state:", counts)
    print(f"figure: {figure}")
    return {"states": table, "counts": counts, "figure": str(figure)}


if __name__ == "__main__":
    main()
