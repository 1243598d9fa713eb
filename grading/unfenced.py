"""Grading without Landlock: what stays open, and the refusal to do it unless the TA accepts the risk.

Landlock is the only layer that stops native code from reading a file: the
audit hook sees only what Python opens, and the payload's reader guards
(`_inferlab_boot`) cover the routes a submission is likely to take. Without
Landlock (`--no-landlock`, or a kernel older than 5.13) a submission that
reads the golden outputs or the hidden tests natively can forge a passing
observations file. So `grade run` refuses to grade then, printing this risk,
unless `--allow-unfenced` says the TA accepts it (a grading machine with an
old kernel, a container that blocks the Landlock system calls).
"""
from __future__ import annotations

# Closed without Landlock too (refused outside what the graded process may read, every use flagged):
# aten::from_file by every route, UntypedStorage.from_file (storage loads, torch.load(mmap=True)), numpy's,
# safetensors' and tokenizers' loaders (trampolines through the audit hook, which alone holds the originals),
# readline's functions, extension modules from outside Python's folders, readline and cffi at import, the gc's
# introspection, sqlite3 files (a write: scratch only).
OPEN_NATIVE_READERS = (
    "TorchScript and mobile loaders (torch.jit.load, torch._C.PyTorchFileReader, "
    "torch._C._load_for_lite_interpreter) open any path natively (they accept only PyTorch archives, so they "
    "cannot return another file's bytes, but they can tell whether a path exists)",
    "native writers (safetensors' save_file, tokenizers' save) can write outside the scratch folder wherever the "
    "graded user may write (e.g. /tmp), past the scratch quota",
    "the audit hook is Python: graded code can monkeypatch what its checks call (the standard library's os.path) "
    "or reach its frame from a callback a library makes while the hook runs, and so get past it",
    "ssl's certificate loaders and any other C function of an installed package that opens a path by itself",
)


class Unfenced(RuntimeError):
    """Landlock is not in force and the TA did not accept grading without it."""


def landlock_abi() -> int:
    from grading.payload._inferlab_landlock import abi_version
    return abi_version()


def risk(reason: str) -> str:
    lines = [f"Landlock is not in force ({reason}): the kernel will not stop native code in a graded process from "
             "reading files. The audit hook and the reader guards still refuse what a submission usually tries, but "
             "these stay open, through which a submission could read the golden outputs or the hidden tests and "
             "forge a full score:"]
    lines += [f"  - {item}" for item in OPEN_NATIVE_READERS]
    lines.append("Grade on a Linux kernel with Landlock (5.13 or newer, not blocked by the container), or pass "
                 "--allow-unfenced to accept this risk.")
    return "\n".join(lines)


def check(landlock: bool, allow_unfenced: bool) -> str | None:
    """None when Landlock will be in force; the reason when not and `allow_unfenced` (raises Unfenced otherwise)."""
    if landlock and landlock_abi() > 0:
        return None
    reason = "--no-landlock" if not landlock else "this kernel has no Landlock"
    if not allow_unfenced:
        raise Unfenced(risk(reason))
    return reason
