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
NO_CODE_ROOTS = ("/etc", "/proc", "/sys", "/dev")     # readable, but no extension module is loaded from there


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


def _reporters(policy):
    """(refuse, note): write the tag line the grader turns into a flag, then refuse (raise) or go on.

    A use on the model's folder is the engine's own (safetensors maps the
    weights through `UntypedStorage.from_file`): not noted; nor is an
    argument that names no file (`framework="pt"`).
    """
    write = os.write
    model = os.path.realpath(os.environ.get(MODEL_ENV) or "/nonexistent-model")

    def refuse(name: str, path: str) -> None:
        write(2, f"{_inferlab_sandbox.DENIED_TAG} {name} {path!r}\n".encode("utf-8", "replace"))
        raise PermissionError(f"inferlab grader: {name} of {path} is not allowed while grading")

    def note(name: str, path: str) -> None:
        full = os.path.realpath(path)
        if full == model or full.startswith(model + os.sep) or not os.path.exists(full):
            return                                   # the engine's weights, or an argument that is not a file
        write(2, f"{_inferlab_sandbox.NOTED_TAG} {name} {path!r}\n".encode("utf-8", "replace"))

    return refuse, note


def _guard_native_readers(policy) -> list[str]:
    """Wrap the file readers of loaded libraries that bypass Python's `open` (so its audit event).

    Landlock stops these at the kernel where it exists; without it this is
    the only check, and it covers the readers a submission is likely to try,
    not every native entry point (`grading.unfenced.OPEN_NATIVE_READERS`
    lists what stays open; the grader refuses to run without Landlock unless
    told to). A wrapper holds the original, which graded code could reach
    through the wrapper's closure: torch's readers are therefore closed
    without keeping one (`_close_torch_readers`).
    """
    allowed = _inferlab_sandbox.read_allowed
    refuse, note = _reporters(policy)

    def guarded(fn, name):
        def wrapper(*args, **kwargs):
            for path in [*args, *kwargs.values()]:
                if isinstance(path, (str, bytes, os.PathLike)):
                    shown = os.fsdecode(os.fspath(path))
                    if not allowed(policy, path):
                        refuse(name, shown)
                    note(name, shown)
            return fn(*args, **kwargs)
        return wrapper

    import safetensors
    import safetensors.numpy
    import tokenizers
    import tokenizers.models
    targets = [(numpy, "fromfile"), (safetensors, "safe_open"), (safetensors.torch, "load_file"),
               (safetensors.numpy, "load_file"), (tokenizers.Tokenizer, "from_file")]
    targets += [(getattr(tokenizers.models, model), method) for model in ("BPE", "WordPiece", "WordLevel")
                for method in ("from_file", "read_file") if hasattr(tokenizers.models, model)]
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


def _close_torch_readers(policy) -> list[str]:
    """torch's file readers, closed where graded code cannot undo it, and every use flagged.

    `aten::from_file` (`torch.from_file`, `torch.ops.aten.from_file`, a
    TorchScript function calling it: every route goes through the
    dispatcher) gets a CPU kernel of ours, and `UntypedStorage.from_file`
    (storage loads, `torch.load(mmap=True)`) a class method of ours in the C
    type's own dictionary. Neither keeps the original: both read through
    Python's `open`, which the audit hook checks, after the same read rule,
    and refuse a shared memory map. The dispatcher registration is leaked on
    purpose (its handle unreachable from Python, so nothing can deregister
    it). Done before the audit hook is in place (it takes ctypes). The
    price: these readers copy instead of mapping (the engine uses neither),
    and each use is flagged for the TA.
    """
    import ctypes
    import gc
    import warnings

    allowed = _inferlab_sandbox.read_allowed
    refuse, note = _reporters(policy)

    def contents(name: str, filename, shared) -> bytes:
        path = os.fsdecode(os.fspath(filename))
        if shared:
            refuse(f"{name} (a shared memory map of a file)", path)
        if not allowed(policy, path):
            refuse(name, path)
        note(name, path)
        with open(path, "rb") as handle:
            return handle.read()

    def from_file(filename, shared=None, size=0, *, dtype=None, layout=None, device=None, pin_memory=None):
        dtype = dtype or torch.get_default_dtype()
        data = contents("torch.from_file", filename, shared)
        count = int(size or 0)
        wanted = count * torch.empty((), dtype=dtype).element_size()
        if len(data) < wanted:
            raise RuntimeError(f"from_file: the file holds {len(data)} bytes, {wanted} were asked for")
        return torch.frombuffer(bytearray(data[:wanted]), dtype=dtype) if count else torch.empty(0, dtype=dtype)

    def storage_from_file(cls, filename, shared=False, nbytes=0):
        data = contents("torch.UntypedStorage.from_file", filename, shared)
        wanted = int(nbytes or 0)
        if len(data) < wanted:
            raise RuntimeError(f"from_file: the file holds {len(data)} bytes, {wanted} were asked for")
        storage = cls(wanted)
        if wanted:
            storage.copy_(torch.frombuffer(bytearray(data[:wanted]), dtype=torch.uint8).untyped_storage())
        return storage

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                    # "overriding a previously registered kernel"
        library = torch._C._dispatch_library("IMPL", "aten", "")
        library.impl("from_file", "CPU", from_file, False)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))
    del library
    base = torch._C.StorageBase
    gc.get_referents(base.__dict__)[0]["from_file"] = classmethod(storage_from_file)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(base))
    return ["aten::from_file", "StorageBase.from_file"]


def fence() -> dict:
    """Warm up and fence this process from the policy in the environment; returns what is in force."""
    warm_up()
    policy = _inferlab_sandbox.Policy.from_env()
    landlock = json.loads(os.environ.pop("INFERLAB_LANDLOCK", "true"))
    roots = read_roots(policy.hidden)
    code = [root for root in roots if not any(root == r or root.startswith(r + os.sep) for r in NO_CODE_ROOTS)]
    closed = _close_torch_readers(policy)
    summary = _inferlab_sandbox.install(policy, roots if landlock else None, code_roots=code)
    summary["guarded_readers"] = len(_guard_native_readers(policy)) + len(closed)
    return summary
