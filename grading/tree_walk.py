"""Reading a submission's files: one walk of the real tree, within limits, for hashing and for grading.

Why one walk: the resume rule ("a result made from the same files is kept")
is only sound if the hash covers every byte the grader reads, and the grader
only reads what the hash covers. So `read_tree` is the only code that looks at
a submitted tree: it hashes what it reads and, when asked, copies it into a
private folder (`copy_to`) from which everything else (extraction, report
items, feedback locations) reads. That copy holds regular files only.

The rules, each reported to the student (`notes`) and, where it changes what
is graded, to the TA (`flags`):

- a symbolic link (to a file or a folder) whose target lies outside the
  submission is refused: it is graded as if absent. A link inside the
  submission is followed, and a folder reached through a link is walked once:
  a folder link met inside it is not followed again, so no loop of links
  can multiply the tree;
- only regular files are read (FIFOs, sockets and devices are refused: a
  FIFO would block whoever opens it);
- names whose bytes are not UTF-8 are listed with their bytes escaped and not
  read (they could not be written to a result, and no module is named so);
- hidden entries (`.git`, `.venv`, ...) and `__pycache__` are skipped
  silently: never read, never run;
- `Limits`: entries walked, total bytes, one file's bytes, one Python module's
  bytes (the grader parses those), folder depth. The package
  (`student_exercises/`) is walked first, so junk beside it cannot crowd it
  out of the entry budget.

Memory is bounded whatever the tree: files are streamed in chunks, folders
larger than the remaining entry budget are not listed, and the walk keeps a
stack, not recursion (a folder nested 1,100 levels deep once crashed
`Path.rglob`). The price of the copy: one more write of at most
`Limits.total_bytes` per submission graded.
"""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from labkit.tree import PACKAGE

CHUNK = 1 << 20
# What `hashes` holds for a path the walk did not read (sha256 hex digests otherwise).
REFUSED_LINK = "symlink"
TOO_LARGE = "too-large"
NOT_READ = "not-read"
NOT_REGULAR = "not-regular"
BAD_NAME = "name-not-utf8"
SKIPPED_NAMES = frozenset({"__pycache__"})


@dataclass(frozen=True)
class Limits:
    """How much of one submission the grader reads (docs/grading.md names the defaults and why)."""

    entries: int = 10_000            # files, folders and links walked
    total_bytes: int = 256 << 20     # bytes read, all files together
    file_bytes: int = 32 << 20       # one file
    module_bytes: int = 64 << 10     # one Python module of the package: the grader parses it
    depth: int = 32                  # folders below the submission's root

    def describe(self) -> str:
        return (f"at most {self.entries} files and folders, {_mib(self.total_bytes)} in all, {_mib(self.file_bytes)} "
                f"per file ({_mib(self.module_bytes)} per Python module of {PACKAGE}/), {self.depth} folders deep")


@dataclass
class TreeReading:
    """What one walk found: a hash (or why not) per path, messages for the student and the TA."""

    hashes: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)       # to the student (and the TA)
    flags: list[str] = field(default_factory=list)       # for the TA's review: what was refused, and why
    bytes_read: int = 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def shown(name: str) -> str:
    """A name as it can be printed and stored: bytes that are not UTF-8 written as \\xNN."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class _Walk:
    def __init__(self, root: Path, limits: Limits, copy_to: Path | None, first: tuple[str, ...]):
        self.root = os.path.realpath(root)
        self.limits = limits
        self.copy_to = copy_to
        self.first = first
        self.out = TreeReading()
        self.budget = limits.entries
        self.stopped_at: str | None = None
        self.over_total: str | None = None
        self.over_count = 0
        self.too_deep: list[str] = []
        self.too_big: list[str] = []

    # -- messages -------------------------------------------------------------------------------

    def refuse(self, rel: str, value: str, why: str) -> None:
        self.out.hashes[rel] = value
        self.out.notes.append(f"{rel}: {why}")
        self.out.flags.append(f"{rel}: {why}")

    # -- the walk -------------------------------------------------------------------------------

    def run(self) -> TreeReading:
        """A preorder walk in name order (`first` at the top), with a stack: each folder whole before its next sibling."""
        if not os.path.isdir(self.root):
            return self.out
        # ("folder", path, parts, via_link): list it; ("entry", DirEntry, parts, via_link): visit it.
        stack: list[tuple] = [("folder", self.root, (), False)]
        while stack and self.stopped_at is None:
            kind, item, parts, via_link = stack.pop()
            if kind == "folder":
                stack += [("entry", entry, parts, via_link) for entry in reversed(self.children(item, parts))]
                continue
            folder = self.visit(item, parts, via_link)
            if folder is not None:
                stack.append(("folder", *folder))
        self.finish()
        return self.out

    def children(self, folder: str, parts: tuple[str, ...]) -> list[os.DirEntry]:
        """The folder's entries in name order, `first` at the top; none of them when they exceed the budget.

        At the top, the `first` entries are kept even then: the package is
        read whatever lies beside it.
        """
        top = not parts
        rel = "/".join(parts) or "."
        kept: list[os.DirEntry] = []
        others: list[os.DirEntry] = []
        overflow = False
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if entry.name.startswith(".") or entry.name in SKIPPED_NAMES:
                        continue
                    if top and entry.name in self.first:
                        kept.append(entry)
                    elif not overflow:
                        others.append(entry)
                    if len(kept) + len(others) > self.budget and not overflow:
                        overflow, others = True, []
                        if not top:
                            break
        except OSError as err:
            self.out.notes.append(f"{rel}/: could not be listed ({err.strerror}): not read")
            return []
        if overflow:
            self.too_big.append(rel)
        return sorted(kept, key=lambda e: self.first.index(e.name)) + sorted(others, key=lambda e: e.name)

    def visit(self, entry: os.DirEntry, parts: tuple[str, ...], via_link: bool):
        name = entry.name
        if not _utf8(name):
            rel = "/".join([*parts, shown(name)])
            self.refuse(rel, BAD_NAME, "the name is not valid UTF-8 (an old zip tool can do this): not read; "
                                       "rename it")
            return None
        rel = "/".join([*parts, name])
        self.budget -= 1
        if self.budget < 0:
            self.stopped_at = rel
            return None
        try:
            if entry.is_symlink():
                return self.link(entry.path, rel, parts + (name,), via_link)
            if entry.is_dir(follow_symlinks=False):
                return self.folder(entry.path, rel, parts + (name,), via_link)
            if entry.is_file(follow_symlinks=False):
                self.file(entry.path, rel)
                return None
        except OSError as err:
            self.out.hashes[rel] = NOT_READ
            self.out.notes.append(f"{rel}: could not be read ({err.strerror}): not graded")
            return None
        self.refuse(rel, NOT_REGULAR, "not a regular file (a FIFO, socket or device): not read")
        return None

    def folder(self, path: str, rel: str, parts: tuple[str, ...], via_link: bool):
        if len(parts) > self.limits.depth:
            self.too_deep.append(rel)
            return None
        return (path, parts, via_link)

    def link(self, path: str, rel: str, parts: tuple[str, ...], via_link: bool):
        target = os.path.realpath(path)
        if not _inside(target, self.root):
            self.refuse(rel, REFUSED_LINK, "a symbolic link to something outside the submission: refused "
                                           "(graded as if it were absent; submit the files themselves)")
            return None
        if os.path.isdir(target):
            if via_link:
                self.refuse(rel, REFUSED_LINK, "a link to a folder, inside a folder reached through a link: "
                                               "not followed again")
                return None
            self.out.notes.append(f"{rel}: a symbolic link inside the submission, followed")
            return self.folder(target, rel, parts, True)
        if os.path.isfile(target):
            self.out.notes.append(f"{rel}: a symbolic link inside the submission, followed")
            self.file(target, rel)
            return None
        self.refuse(rel, REFUSED_LINK, "a broken symbolic link (or one to a FIFO, socket or device): not read")
        return None

    def file(self, path: str, rel: str) -> None:
        limits = self.limits
        size = os.stat(path).st_size
        module = rel.startswith(PACKAGE + "/") and rel.endswith(".py")
        cap = min(limits.file_bytes, limits.module_bytes) if module else limits.file_bytes
        if size > cap:
            what = "a Python module of the package" if module else "one file"
            self.refuse(rel, TOO_LARGE, f"{_mib(size)}, over the limit for {what} ({_mib(cap)}): not read")
            return
        if self.over_total is not None or self.out.bytes_read + size > limits.total_bytes:
            self.over_total = self.over_total or rel
            self.over_count += 1
            self.out.hashes[rel] = NOT_READ
            return
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.refuse(rel, NOT_REGULAR, "not a regular file: not read")
                return
            digest, n = self.stream(fd, rel, cap)
        finally:
            os.close(fd)
        if digest is None:
            self.refuse(rel, TOO_LARGE, f"grew past the limit of {_mib(cap)} while it was read: not read")
            return
        self.out.bytes_read += n
        self.out.hashes[rel] = digest

    def stream(self, fd: int, rel: str, cap: int) -> tuple[str | None, int]:
        """sha256 of the file (copied to `copy_to` as it is read), or None when it is longer than `cap`."""
        h, n = hashlib.sha256(), 0
        target = None
        if self.copy_to is not None:
            dest = self.copy_to / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            target = open(dest, "wb")
        try:
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                n += len(chunk)
                if n > cap:
                    if target is not None:
                        target.close()
                        target = None
                        os.unlink(self.copy_to / rel)
                    return None, n
                h.update(chunk)
                if target is not None:
                    target.write(chunk)
        finally:
            if target is not None:
                target.close()
        return h.hexdigest(), n

    def finish(self) -> None:
        limits = self.limits
        if self.stopped_at is not None:
            why = (f"the submission has more than {limits.entries} files and folders: reading stopped at "
                   f"{self.stopped_at}; nothing from there on was read (graded as if absent)")
            self.out.notes.append(why)
            self.out.flags.append(why)
        if self.over_total is not None:
            why = (f"the submission is over {_mib(limits.total_bytes)} in all: {self.over_total} and {self.over_count - 1} "
                   f"later file(s) were not read (graded as if absent)")
            self.out.notes.append(why)
            self.out.flags.append(why)
        if self.too_big:
            why = (f"{len(self.too_big)} folder(s) held more entries than the {limits.entries} files and folders the "
                   f"grader reads, and were not read (first: {self.too_big[0][:300]}/)")
            self.out.notes.append(why)
            self.out.flags.append(why)
        if self.too_deep:
            why = (f"{len(self.too_deep)} folder(s) nested deeper than {limits.depth} levels were not read "
                   f"(first: {self.too_deep[0][:300]}...)")
            self.out.notes.append(why)
            self.out.flags.append(why)


def read_tree(root: Path, limits: Limits | None = None, copy_to: Path | None = None,
              first: tuple[str, ...] = (PACKAGE,)) -> TreeReading:
    """Walk `root` as the rules above say; hash every file read, and copy it under `copy_to` when given.

    `copy_to` must not exist yet or be empty: it receives only regular files,
    at their paths relative to `root` (a followed link's target lands at the
    link's path).
    """
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
    return _Walk(Path(root), limits or Limits(), copy_to, first).run()
