"""Slide "调用链": LLM.generate -> LLMEngine.step -> Scheduler.schedule -> ModelRunner.run, traced from a real run.

    python -m slides_code.call_chain
"""
from __future__ import annotations

if not __package__:   # run as `python slides_code/X.py`: put the repository first on the path, as `-m` does
    import sys as _sys, pathlib as _pathlib
    _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parents[1]))

import os
import sys

from slides_code._common import model_dir, parse_args, setup_torch


# --- slide: 用 sys.setprofile 追踪调用链（1）：记下每次调用的深度 ---
def make_profiler(calls, stack, package_dir):
    def profiler(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(package_dir):
            name = getattr(code, "co_qualname", code.co_name)   # co_qualname: Python 3.11+
            if not name.split(".")[-1].startswith("<"):          # skip comprehensions
                calls.append((len(stack), name))
                stack.append(frame)
        elif event == "return" and stack and stack[-1] is frame:
            stack.pop()
    return profiler
# --- end slide ---


# --- slide: 用 sys.setprofile 追踪调用链（2）：只在 fn() 运行时打开 ---
def trace_calls(fn, package_dir):
    """Run fn(); return [(depth, qualified name)] for each call into package_dir."""
    calls, stack = [], []
    sys.setprofile(make_profiler(calls, stack, package_dir))
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls
# --- end slide ---


def main(argv: list[str] | None = None) -> list[tuple[int, str]]:
    parse_args(argv, __doc__.splitlines()[0])
    setup_torch()
    from reference import LLM, SamplingParams
    llm = LLM(model_dir(), device="auto")
    params = SamplingParams(temperature=0.0, max_tokens=2)
    # The engine's package folder (reference/, or a student release's student_exercises/): its calls are traced.
    engine_dir = os.path.dirname(sys.modules[SamplingParams.__module__.split(".")[0]].__file__)

    # --- slide: 一次 generate 的调用树（前三层） ---
    calls = trace_calls(lambda: llm.generate(["hello"], params, use_tqdm=False), engine_dir)
    shown = None
    for depth, name in calls:
        if depth <= 2 and (depth, name) != shown:   # fold repeated siblings
            print("    " * depth + name)
            shown = (depth, name)
    # --- end slide ---
    return calls


if __name__ == "__main__":
    main()
