"""Kernel refusal of process creation for a graded process (Linux seccomp), applied to itself.

Copied into every harness as `_inferlab_seccomp.py`; standard library only.

Why: the audit hook sees `os.fork`, `subprocess.Popen` and `os.posix_spawn`,
but not `_posixsubprocess.fork_exec` (which raises no audit event) nor native
code, and a child started that way left the item's process group and outlived
the grading run. A seccomp filter makes the kernel itself refuse, in every
thread of this process and for good: fork, vfork, clone without CLONE_THREAD
(threads stay allowed), execve and execveat; clone3 answers ENOSYS (its flags
live in memory a filter cannot read, and glibc then falls back to clone), and
any other system-call ABI (i386, x32) is refused the same way.

A refused call kills the whole process with SIGSYS (SECCOMP_RET_KILL_PROCESS),
which the grader reads from the exit status and names in the result. Not a
trap that lets the call fail: with SECCOMP_RET_KILL the "failed" fork returned
a number that looked like a child's pid, and glibc blocks signals around fork,
so the trap killed the process anyway. Not an errno either: nothing would tell
the grader. Python-level routes never get this far: the audit hook refuses
them (with a PermissionError and a refusal line) before the system call. The
price: nothing in a graded process may start a process even for a good reason
(no tool in the engine does).
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_GET_SECCOMP = 38, 22, 21
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, SECCOMP_MODE_FILTER = 1, 1, 2
RET_ALLOW, RET_KILL, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
ENOSYS = 38
CLONE_THREAD = 0x00010000
X32_BIT = 0x40000000

# machine: (AUDIT_ARCH, seccomp syscall, clone, clone3, [refused outright])
ARCHES = {
    "x86_64": (0xC000003E, 317, 56, 435, {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322}),
    "aarch64": (0xC00000B7, 277, 220, 435, {"execve": 221, "execveat": 281}),
}

# classic BPF opcodes
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The BPF program as (code, jt, jf, k) rows; jumps are relative to the next row."""
    arch, _, clone, clone3, refused = ARCHES[machine]
    rows: list[tuple[int, int, int, int]] = [
        (LD_W_ABS, 0, 0, 4),                       # seccomp_data.arch
        (JEQ_K, 1, 0, arch),
        (RET_K, 0, 0, RET_KILL),                   # another ABI: refused
        (LD_W_ABS, 0, 0, 0),                       # seccomp_data.nr
        (JGE_K, 0, 1, X32_BIT),
        (RET_K, 0, 0, RET_KILL),                   # x32 numbers
        (JEQ_K, 0, 1, clone3),
        (RET_K, 0, 0, RET_ERRNO | ENOSYS),
    ]
    for number in refused.values():
        rows += [(JEQ_K, 0, 1, number), (RET_K, 0, 0, RET_KILL)]
    rows += [
        (JEQ_K, 1, 0, clone),
        (RET_K, 0, 0, RET_ALLOW),
        (LD_W_ABS, 0, 0, 16),                      # low word of args[0]: clone's flags (little-endian)
        (JSET_K, 0, 1, CLONE_THREAD),
        (RET_K, 0, 0, RET_ALLOW),                  # a thread
        (RET_K, 0, 0, RET_KILL),                   # a process
    ]
    return rows


def active() -> bool:
    """Whether a seccomp filter is already in force for this thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) == SECCOMP_MODE_FILTER


def restrict() -> dict | None:
    """Install the filter on every thread of this process; None where the machine has no table here.

    Raises OSError when the kernel refuses the filter.
    """
    machine = platform.machine()
    if machine not in ARCHES or struct.pack("=I", 1) != struct.pack("<I", 1):
        return None
    rows = program(machine)
    table = (_Filter * len(rows))(*[_Filter(*row) for row in rows])
    prog = _Prog(len(rows), table)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    seccomp = ARCHES[machine][1]
    if libc.syscall(ctypes.c_long(seccomp), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                    ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SET_MODE_FILTER, TSYNC) failed")
    return {"refuses": ["clone (processes)", "clone3", *ARCHES[machine][4]]}
