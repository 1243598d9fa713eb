"""Kernel-level file-system fence for a graded process (Linux Landlock), applied to itself.

Copied into every harness as `_inferlab_landlock.py`; standard library only.

Why a kernel fence on top of the Python audit hook (`_inferlab_sandbox`): the
audit hook sees only what Python code opens. Native code reads files without
asking Python (`torch.from_file`, safetensors, tokenizers' Rust loaders), so a
submission could read the golden outputs through them. Landlock makes the
kernel itself refuse every path outside an allow-list, for this process and
everything it starts, and it cannot be undone once applied. It needs no
privileges; where the kernel lacks it, `restrict` returns None and the caller
records that only the audit hook was in force.

Rules applied: read (and execute) beneath `read_roots`; read and write beneath
`write_roots`; `/dev/null` writable; on ABI >= 4 no TCP bind or connect; on
ABI >= 6 no signals to processes outside this domain (the grader, the zygote).
"""
from __future__ import annotations

import ctypes
import os
import platform

_SYS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
PR_SET_NO_NEW_PRIVS = 38
RULE_PATH_BENEATH = 1
CREATE_RULESET_VERSION = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fs_rights(abi: int) -> int:
    """Every file-system right this kernel's Landlock knows (handled = denied unless granted)."""
    rights = (1 << 13) - 1                      # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def abi_version() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is missing or disabled."""
    numbers = _SYS.get(platform.machine())
    if numbers is None or not hasattr(ctypes, "CDLL"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(numbers[0]), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(CREATE_RULESET_VERSION))
    return int(version) if version > 0 else 0


def restrict(read_roots: list[str], write_roots: list[str], list_roots: list[str] = (),
             devices: list[str] | None = None) -> dict | None:
    """Fence this thread (and its future children) to the given roots; None when unavailable.

    `list_roots` may be listed (and walked through) but their files not read.
    `devices` (the GPU's /dev/nvidia* files, on CUDA machines only) may be
    opened read-write and take ioctls: a CUDA context opens more of them after
    the fence. Roots that do not exist are skipped. Returns a summary for the result file.
    """
    abi = abi_version()
    if abi <= 0:
        return None
    create, add_rule, restrict_self = _SYS[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fs = _fs_rights(abi)
    attr = _RulesetAttr(fs, (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(ctypes.c_long(create), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read_rights = EXECUTE | READ_FILE | READ_DIR
    granted: list[str] = []
    try:
        rules = [(p, read_rights) for p in read_roots] + [(p, fs) for p in write_roots]
        rules += [(p, READ_DIR) for p in list_roots if os.path.isdir(p)]
        rules.append(("/dev/null", READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0)))
        rules += [(p, READ_FILE | WRITE_FILE | IOCTL_DEV) for p in devices or ()]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    rights &= FILE_RIGHTS
                rule = _PathBeneathAttr(rights & fs, fd)
                if libc.syscall(ctypes.c_long(add_rule), ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
                granted.append(path)
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(ctypes.c_long(restrict_self), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return {"abi": abi, "granted": len(granted), "signals_scoped": abi >= 6, "tcp_denied": abi >= 4}
