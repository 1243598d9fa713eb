"""A graded process's scratch folder, with a quota on what it may write there in total.

RLIMIT_FSIZE caps each file a graded process writes, not their number: an
item that wrote many files of 64 MiB once filled the grader's disk, and a
classmate graded at the same time lost points. So each scratch folder has a
quota on its total bytes and files:

- enforced by the kernel where the grader may mount (root, as the process
  fence needs anyway): a tmpfs of the quota's size and inode count is mounted
  on the folder for the item's life. A write past it fails with ENOSPC in the
  graded process, never touches the disk, and nobody else notices. It is
  mounted nosuid and nodev, and noexec unless the item must run what it
  compiles (GPU items: Triton loads the launchers it builds there), so a
  submission cannot write a shared library there and load it;
- otherwise by polling: a thread adds up the folder every `POLL_S` and kills
  the item's processes once it is over; the disk may then hold what was
  written between two looks (at most a few hundred MB at disk speed).

Either way the item is flagged with the quota it hit. The price of the tmpfs:
what an item writes lives in memory until the item ends (at most the quota
per running item; items that behave write a few megabytes).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

POLL_S = 0.2
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_PRIVATE = 2, 4, 8, 1 << 18
MNT_DETACH = 2


@dataclass(frozen=True)
class Quota:
    """What one graded process may keep in its scratch folder (docs/grading.md says why these defaults)."""

    bytes: int = 512 << 20
    files: int = 100_000
    kernel: bool = True          # False: polling only (tests of the fallback)

    def describe(self) -> str:
        return f"{self.bytes / (1 << 20):g} MiB or {self.files} files"


MOUNT_SOURCE = "inferlab-scratch"   # the source field of every scratch tmpfs in /proc/mounts


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(path: Path, quota: Quota, executable: bool) -> bool:
    """Mount a tmpfs of the quota's size on `path` (private to this mount namespace); False where we may not."""
    if os.geteuid() != 0 or not quota.kernel:
        return False
    flags = MS_NOSUID | MS_NODEV | (0 if executable else MS_NOEXEC)
    options = f"size={quota.bytes},nr_inodes={quota.files},mode=0700".encode()
    libc = _libc()
    if libc.mount(MOUNT_SOURCE.encode(), os.fsencode(path), b"tmpfs", flags, options) != 0:
        return False
    libc.mount(None, os.fsencode(path), None, MS_PRIVATE, None)   # umounts elsewhere never reach it, nor ours them
    return True


def mounts_beneath(path: Path) -> list[str]:
    """Mount points at or below `path` in this mount namespace, deepest first (from /proc/self/mountinfo)."""
    root = os.path.realpath(path)
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
            for line in handle:
                point = line.split(" ")[4]
                for code in ("\\040", "\\011", "\\012", "\\134"):
                    point = point.replace(code, chr(int(code[1:], 8)))
                if point == root or point.startswith(root.rstrip("/") + "/"):
                    found.append(point)
    except OSError:
        return []
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_beneath(path: Path) -> None:
    """Detach every mount at or below `path` (a scratch tmpfs left by a grader that was killed)."""
    libc = _libc()
    for point in mounts_beneath(path):
        libc.umount2(os.fsencode(point), MNT_DETACH)


def clear(path: Path) -> None:
    """Remove a scratch or work folder: unmount what is mounted in it, then delete, read-only parts included."""
    def unlock(func, target, _exc):
        try:
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass
    if os.path.lexists(path):
        unmount_beneath(path)
        shutil.rmtree(path, onerror=unlock)


def usage(path: Path, stop_after_files: int) -> tuple[int, int]:
    """(bytes on disk, files) below `path`, counting stopped once past `stop_after_files` (no recursion)."""
    total, count = 0, 0
    stack = [str(path)]
    while stack and count <= stop_after_files:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    count += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return total, count


class Scratch:
    """`with Scratch(path, quota) as scratch:` a fresh folder under quota; `watch(kill)` once the item runs.

    Read what the item left (its observations) inside the `with`: on leaving,
    the tmpfs is unmounted and the folder removed.
    """

    def __init__(self, path: Path, quota: Quota | None = None, executable: bool = False):
        self.path = path
        self.quota = quota or Quota()
        self.executable = executable
        self.kernel = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._killed = ""

    def __enter__(self) -> "Scratch":
        clear(self.path)
        self.path.mkdir(parents=True)
        self.kernel = _mount_tmpfs(self.path, self.quota, self.executable)
        return self

    def watch(self, kill: Callable[[], None]) -> None:
        """Without the kernel's quota: poll the folder and call `kill` once it is over."""
        if self.kernel or self._thread is not None:
            return

        def poll() -> None:
            while not self._stop.wait(POLL_S):
                used, files = usage(self.path, self.quota.files)
                if used > self.quota.bytes or files > self.quota.files:
                    self._killed = f"{used / (1 << 20):.0f} MiB in {files} files"
                    kill()
                    return

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def over(self) -> str | None:
        """A flag when the item hit its quota (None otherwise); call before leaving the `with`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._killed:
            return (f"wrote more than its scratch quota ({self.quota.describe()}; found {self._killed}): "
                    "killed")
        if self.kernel:
            try:
                info = os.statvfs(self.path)
            except OSError:
                return None
            if info.f_bavail * info.f_frsize < (1 << 20) or info.f_favail == 0:
                return f"filled its scratch quota ({self.quota.describe()}): writes past it failed"
        return None

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        clear(self.path)
