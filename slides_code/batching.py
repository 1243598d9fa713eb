"""Slide "Static vs continuous batching": the same requests, the same engine, two admission policies.

    python -m slides_code.batching [--out DIR]     # writes batching.png
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

import random
import time

from slides_code._common import figure_path, model_dir, out_dir, parse_args, setup_torch

BATCH = 4
OUTPUT_LENGTHS = [16, 12, 16, 12, 12, 96, 12, 4, 96, 12, 4, 16, 12, 12, 96, 16]


# --- slide: static batching：一组跑完才放下一组 ---
def run_static(llm, requests, batch):
    for g in range(0, len(requests), batch):
        for prompt, params in requests[g:g + batch]:
            llm.add_request(prompt, params)
        while not llm.is_finished():   # the group waits for its longest request
            llm.step()
# --- end slide ---


# --- slide: continuous batching：每一步都可以进出 ---
def run_continuous(llm, requests):
    for prompt, params in requests:
        llm.add_request(prompt, params)
    while not llm.is_finished():       # the scheduler refills free slots every step
        llm.step()
# --- end slide ---


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, __doc__.splitlines()[0])
    out = out_dir(args)
    setup_torch()
    from reference import LLM, SamplingParams
    model = model_dir()

    def requests():
        rng = random.Random(0)
        return [([rng.randrange(1000) for _ in range(rng.randint(16, 48))],
                 SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)) for m in OUTPUT_LENGTHS]

    results = {}
    for name, run in (("static", lambda llm: run_static(llm, requests(), BATCH)),
                      ("continuous", lambda llm: run_continuous(llm, requests()))):
        llm = LLM(model, device="auto", max_num_seqs=BATCH, enable_prefix_caching=False)
        t0 = time.perf_counter()
        run(llm)
        wall = time.perf_counter() - t0
        steps = [e for e in llm.log.events if e["event"] == "STEP"]
        tokens = sum(1 for e in llm.log.events if e["event"] in ("FIRST_TOKEN", "TOKEN"))
        results[name] = {"steps": len(steps), "wall_s": wall, "tok_per_s": tokens / wall,
                         "batch_sizes": [e["batch_size"] for e in steps]}
        print(f"{name:>10}: {len(steps):4d} steps, {tokens} tokens, {tokens / wall:7.0f} tok/s")

    figure = figure_path(out, "batching.png")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(10, 4), sharex=True, sharey=True)
    for ax, (name, r) in zip(axes, results.items()):
        ax.fill_between(range(r["steps"]), r["batch_sizes"], step="post", alpha=0.4)
        ax.step(range(r["steps"]), r["batch_sizes"], where="post")
        ax.set(ylabel="batch size", title=f"{name} batching: {r['steps']} steps")
    axes[-1].set_xlabel("engine step")
    fig.tight_layout()
    fig.savefig(figure, dpi=150)
    plt.close(fig)
    print(f"figure: {figure}")
    results["figure"] = str(figure)
    return results


if __name__ == "__main__":
    main()
