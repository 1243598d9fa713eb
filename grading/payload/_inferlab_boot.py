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


def _native_readers() -> dict[str, tuple[object, str]]:
    """name -> (owner, attribute) of the loaded libraries' file readers that bypass Python's `open`.

    Landlock stops these at the kernel where it exists; without it the audit
    hook checks them (`_trampolines`), which covers the readers a submission
    is likely to try, not every native entry point
    (`grading.unfenced.OPEN_NATIVE_READERS` lists what stays open; the grader
    refuses to run without Landlock unless told to).
    """
    import safetensors
    import safetensors.numpy
    import tokenizers
    import tokenizers.models
    targets = [(numpy, "fromfile"), (safetensors, "safe_open"), (safetensors.torch, "load_file"),
               (safetensors.numpy, "load_file"), (tokenizers.Tokenizer, "from_file")]
    targets += [(getattr(tokenizers.models, model), method) for model in ("BPE", "WordPiece", "WordLevel")
                for method in ("from_file", "read_file") if hasattr(tokenizers.models, model)]
    return {f"{getattr(owner, '__name__', owner)}.{attr}": (owner, attr) for owner, attr in targets
            if getattr(owner, attr, None) is not None}


def _trampolines(readers: dict[str, tuple[object, str]]) -> dict[str, object]:
    """Replace each reader by a trampoline through the audit hook; returns the originals, for the hook alone.

    The trampoline holds the reader's name, nothing else: it raises
    `_inferlab_sandbox.NATIVE_EVENT`, the hook checks the paths and calls the
    original (`_inferlab_sandbox._install_hook` says why not a wrapper).
    """
    audit, event = sys.audit, _inferlab_sandbox.NATIVE_EVENT

    def trampoline_for(name: str):
        def trampoline(*args, **kwargs):
            box: list = []
            audit(event, name, args, kwargs, box)
            return box[0]
        return trampoline

    originals = {}
    for name, (owner, attr) in readers.items():
        original = getattr(owner, attr)
        replacement = trampoline_for(name)
        try:
            setattr(owner, attr, staticmethod(replacement) if isinstance(owner, type) else replacement)
        except (AttributeError, TypeError):
            continue
        originals[name] = original
    return originals


def _unload_native_modules() -> list[str]:
    """Modules of `NATIVE_MODULES` a library loaded before the fence (pytest's capture loads readline).

    Their functions are replaced by refusals on the module itself, and the
    module leaves sys.modules, so that importing it again is an import, which
    the audit hook refuses. readline's history loaders read any text file
    line by line without an audit event.
    """
    done = []
    for name in _inferlab_sandbox.NATIVE_MODULES:
        module = sys.modules.pop(name, None)
        if module is None:
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and not attr.startswith("__"):
                setattr(module, attr, _refusal(f"{name}.{attr}"))
        done.append(name)
    return done


def _refusal(name: str):
    def refused(*args, **kwargs):
        os.write(2, f"{_inferlab_sandbox.DENIED_TAG} {name} {args[:1]!r}\n".encode("utf-8", "replace"))
        raise PermissionError(f"inferlab grader: {name} is not allowed while grading")
    return refused


def _read_bytes(path: str) -> bytes:
    """What the closed torch readers read with: Python's `open`, which the audit hook checks as well."""
    with open(path, "rb") as handle:
        return handle.read()


def _close_torch_readers() -> dict[str, object]:
    """torch's file readers, closed where graded code cannot undo it; returns the natives they read through.

    `aten::from_file` (`torch.from_file`, `torch.ops.aten.from_file`, a
    TorchScript function calling it: every route goes through the
    dispatcher) gets a CPU kernel of ours, and `UntypedStorage.from_file`
    (storage loads, `torch.load(mmap=True)`, safetensors' weights) a class
    method of ours in the C type's own dictionary. Neither keeps the
    original; both read through the audit hook's native event (the read rule,
    a flag for any use outside the model) and refuse a shared memory map. The
    dispatcher registration is leaked on purpose (its handle unreachable from
    Python, so nothing can deregister it). Done before the hook is in place
    (it takes ctypes). The price: these readers copy instead of mapping.
    """
    import ctypes
    import gc
    import warnings

    names = {"kernel": "torch.from_file", "storage": "torch.UntypedStorage.from_file"}
    audit, event = sys.audit, _inferlab_sandbox.NATIVE_EVENT

    def contents(name: str, filename, shared) -> bytes:
        path = _inferlab_sandbox.plain_path(filename)
        if shared:
            _refusal(f"{name} (a shared memory map of a file)")(path)
        box: list = []
        audit(event, name, (path,), {}, box)
        return box[0]

    def from_file(filename, shared=None, size=0, *, dtype=None, layout=None, device=None, pin_memory=None):
        dtype = dtype or torch.get_default_dtype()
        data = contents(names["kernel"], filename, shared)
        count = int(size or 0)
        wanted = count * torch.empty((), dtype=dtype).element_size()
        if len(data) < wanted:
            raise RuntimeError(f"from_file: the file holds {len(data)} bytes, {wanted} were asked for")
        return torch.frombuffer(bytearray(data[:wanted]), dtype=dtype) if count else torch.empty(0, dtype=dtype)

    def storage_from_file(cls, filename, shared=False, nbytes=0):
        data = contents(names["storage"], filename, shared)
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
    return {name: _read_bytes for name in names.values()}


def fence() -> dict:
    """Warm up and fence this process from the policy in the environment; returns what is in force."""
    warm_up()
    policy = _inferlab_sandbox.Policy.from_env()
    landlock = json.loads(os.environ.pop("INFERLAB_LANDLOCK", "true"))
    roots = read_roots(policy.hidden)
    code = [root for root in roots if not any(root == r or root.startswith(r + os.sep) for r in NO_CODE_ROOTS)]
    natives = {**_close_torch_readers(), **_trampolines(_native_readers())}
    unloaded = _unload_native_modules()
    summary = _inferlab_sandbox.install(policy, roots if landlock else None, code_roots=code, natives=natives,
                                        quiet=[os.environ.get(MODEL_ENV) or "/nonexistent-model"])
    summary["guarded_readers"] = len(natives) + len(unloaded)
    return summary
