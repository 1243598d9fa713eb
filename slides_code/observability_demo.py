"""Slide "可观测性接口": logger / metrics / trace on a real run (see observability.py).

    python -m slides_code.observability_demo [--out DIR]   # writes observability.trace.json
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

import logging
import sys

from slides_code._common import model_dir, out_dir, parse_args, setup_torch


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, __doc__.splitlines()[0])
    out = out_dir(args)
    setup_torch()
    from reference import LLM, SamplingParams
    from reference.metrics import request_metrics, summarize
    from slides_code.observability import Metrics, StageLogger, Trace, attach

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger, metrics, trace = StageLogger("inferlab.slides"), Metrics(), Trace()
    logger.logger.handlers, logger.logger.propagate = [handler], False
    logger.logger.setLevel(logging.INFO)
    prompts = [list(range(10 * i, 10 * i + 12 + 4 * i)) for i in range(6)]

    # --- slide: 可观测性：log、metrics、trace ---
    llm = LLM(model_dir(), device="auto", max_num_seqs=4)
    attach(llm, logger, metrics, trace)        # every lifecycle event -> logger.info / metrics.observe
    with trace.annotate("generate", num_requests=len(prompts)):
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)

    for name in ("ttft_ms", "tpot_ms", "batch_size"):
        print(name, metrics.summary(name))
    path = trace.write_chrome_trace(out / "observability.trace.json")
    print(f"{len(trace.spans)} spans -> {path} (open in ui.perfetto.dev)")
    # --- end slide ---

    offline = summarize(request_metrics(llm.log.events).values())
    for name, key in (("ttft_ms", "ttft"), ("tpot_ms", "tpot")):
        online = metrics.summary(name)
        assert online["count"] == offline[key]["count"]
        assert abs(online["p50"] - offline[key]["p50"] * 1e3) < 1e-6, (name, online, offline[key])
    print("online metrics == reference.metrics computed from the log: True")
    steps = annotated_steps(LLM(model_dir(), device="auto"), SamplingParams(temperature=0.0, max_tokens=4), trace)
    return {"metrics": {n: metrics.summary(n) for n in ("ttft_ms", "tpot_ms", "batch_size")},
            "trace": str(path), "num_spans": len(trace.spans), "annotated_steps": steps}


def annotated_steps(llm, params, trace) -> list[tuple[str, bool]]:
    """The lecture's `trace.annotate("decode_step_begin")`: one request, so step 0 is its prefill and
    every later step a decode; returns (span name, the log's is_prefill) per step to check that."""
    # --- slide: trace.annotate("decode_step_begin") ---
    llm.add_request(list(range(100, 120)), params)
    with trace.annotate("prefill_step_begin"):
        llm.step()
    while not llm.is_finished():
        with trace.annotate("decode_step_begin", running=len(llm.scheduler.running)):
            llm.step()
    for span in trace.spans[-3:]:
        print(span["name"], f"{(span['end'] - span['start']) * 1e3:.2f} ms")
    # --- end slide ---
    names = [s["name"] for s in trace.spans if s["name"].endswith("_step_begin")]
    return list(zip(names, [e["is_prefill"] for e in llm.log.events if e["event"] == "STEP"]))


if __name__ == "__main__":
    main()
