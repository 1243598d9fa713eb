"""Getting a graded process ready: preload, warm up, then fence (copied into harnesses as `_inferlab_boot.py`).

Shared by the harness's conftest (pytest items) and `_inferlab_throughput.py`
(timed runs), so both fence themselves the same way and at the same moment:
after every shared library the engine needs is loaded (the fence refuses
ctypes and, with Landlock, files outside the allow-list), and before the
first line of student code can run.
"""
from __future__ import annotations

import json
import os
import sys

import numpy  # noqa: F401
import rich.progress  # noqa: F401
import safetensors.torch  # noqa: F401
import torch
import transformers
import xxhash  # noqa: F401
from transformers import AutoTokenizer

import _inferlab_sandbox

MODEL_ENV = "INFERLAB_GRADING_MODEL"
SYSTEM_ROOTS = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev", "/opt"]


def warm_up() -> None:
    """Touch what the engine loads lazily, so that nothing new has to be loaded once fenced."""
    transformers.logging.set_verbosity_error()
    model = os.environ.get(MODEL_ENV)
    if model:
        AutoTokenizer.from_pretrained(model)
    torch.ones(2, 2) @ torch.ones(2, 2)
    torch.nn.functional.softmax(torch.ones(3), dim=-1)
    if torch.cuda.is_available():
        warm_up_cuda()


def warm_up_cuda() -> None:
    """Create the CUDA context, load cuBLAS and start Triton's driver while nothing is fenced yet.

    The context opens the GPU's device files and loads libcuda; Triton's
    driver builds its helper module with the C compiler and runs `ldconfig -p`
    once (cached for the process). After the fence only what the policy
    allows can happen: Triton's ptxas and the C compiler for new kernels.
    Costs each graded process a context creation on GPU machines only.
    """
    x = torch.ones(8, 8, device="cuda")
    (x @ x).sum().item()
    torch.cuda.device_count()          # asks NVML through ctypes, once: cached now that CUDA is initialised
    try:
        from triton.runtime import driver
    except ImportError:
        return
    driver.active.get_current_device()


def read_roots(hidden: list[str]) -> list[str]:
    """Python's own folders and the system folders, minus any that would contain a hidden root."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, *[p for p in sys.path if p], *SYSTEM_ROOTS]
    roots = []
    for path in dict.fromkeys(os.path.realpath(p) for p in candidates):
        if not os.path.exists(path):
            continue
        if any(h == path or h.startswith(path.rstrip(os.sep) + os.sep) for h in hidden):
            continue
        roots.append(path)
    return roots


def _guard_native_readers(policy) -> list[str]:
    """Wrap the file readers of loaded libraries that bypass Python's `open` (so its audit event).

    Landlock stops these at the kernel where it exists; without it this is
    the only check, and it covers the readers a submission is likely to try,
    not every native entry point (see docs/grading.md).
    """
    tag, write = _inferlab_sandbox.DENIED_TAG, os.write
    allowed = _inferlab_sandbox.read_allowed

    def guarded(fn, name):
        def wrapper(*args, **kwargs):
            path = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(path, (str, bytes, os.PathLike)) and not allowed(policy, path):
                write(2, f"{tag} {name} {os.fspath(path)!r}\n".encode("utf-8", "replace"))
                raise PermissionError(f"inferlab grader: {name} of {os.fspath(path)} is not allowed while grading")
            return fn(*args, **kwargs)
        return wrapper

    import safetensors
    import safetensors.numpy
    import tokenizers
    targets = [(torch, "from_file"), (torch.UntypedStorage, "from_file"), (torch._C._VariableFunctions, "from_file"),
               (numpy, "fromfile"), (safetensors, "safe_open"), (safetensors.torch, "load_file"),
               (safetensors.numpy, "load_file"), (tokenizers.Tokenizer, "from_file")]
    done = []
    for owner, attr in targets:
        original = getattr(owner, attr, None)
        if original is None:
            continue
        try:
            setattr(owner, attr, guarded(original, f"{getattr(owner, '__name__', owner)}.{attr}"))
            done.append(f"{getattr(owner, '__name__', owner)}.{attr}")
        except (AttributeError, TypeError):
            pass
    return done


def fence() -> dict:
    """Warm up and fence this process from the policy in the environment; returns what is in force."""
    warm_up()
    policy = _inferlab_sandbox.Policy.from_env()
    landlock = json.loads(os.environ.pop("INFERLAB_LANDLOCK", "true"))
    summary = _inferlab_sandbox.install(policy, read_roots(policy.hidden) if landlock else None)
    summary["guarded_readers"] = len(_guard_native_readers(policy))
    return summary
