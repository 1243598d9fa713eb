"""The process fence of a graded item: its own PID and mount namespaces, a private /proc, no privileges.

Standard library only: `grading/zygote.py` loads this file by path (it must
not import the `grading` package), and the grader imports it to find, stop
and kill what an item left behind.

How a forked item is fenced (`enter`, in the zygote's child C, then
`become_init`, in its child G):

- C unshares a PID and a mount namespace and forks G, which is PID 1 of the
  new PID namespace and becomes the graded process. When G ends, however it
  ends, the kernel kills every other process of the namespace, including any
  that left the process group or the session (a `_posixsubprocess.fork_exec`
  child with `call_setsid=True` used to outlive the run). C only waits for G
  and exits with G's status.
- G mounts a fresh /proc for its namespace: the grader, the zygote and other
  items are not there to read (`/proc/<pid>/environ`, `cmdline`, `fd`) or to
  signal or renice (PID-based calls, and `setpriority(PRIO_USER)`, only reach
  processes the namespace can see).
- G gives up root: uid/gid 65534, no supplementary groups, no capabilities,
  no_new_privs. What that user must reach (Python's prefixes and sys.path,
  the harness, the model, scratch, and a GPU item's device files) is checked
  with the effective ids switched, before the switch is made for good. Where
  a folder above one of them is closed to it (Python under root's 0700 home,
  as pyenv and conda install it), `expose` covers that folder with an empty
  tmpfs inside G's mount namespace and binds just the needed folders back at
  their own paths: nothing changes on the host, and where nothing is closed
  nothing is mounted. Only where a needed folder itself (or a device file) is
  closed to that user does G stay uid 0 with every capability dropped; the
  summary's `missing` says which kind of folder. Its scratch folder is
  handed to the user it runs as.
- `members` finds any process still in the namespace afterwards (there should
  be none: the kernel guarantees it), so the grader can kill and flag it.

Without root (or without namespaces), `enter` returns the error and the item
runs unfenced at this level; the summary's `missing` names what is missing.
The seccomp filter of the payload refuses process creation in either case.

`--spawn fresh` gets the same fence from this file run as a launcher (a fresh
interpreter with no threads, so forking there is safe):

    python -I -B grading/process_fence.py FENCE_JSON FD -- python -I -B -m pytest ...

writes the summary to descriptor FD, closes it, and execs the command as G.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import stat
import sys
from collections.abc import Callable

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE, MNT_DETACH = 1 << 14, 1 << 18, 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
NOBODY = 65534
_CAP_VERSION_3 = 0x20080522


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter() -> str | None:
    """In C: unshare PID and mount namespaces for the next child. Returns an error text, or None."""
    try:
        _check(_libc().unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare(CLONE_NEWPID | CLONE_NEWNS)")
    except OSError as err:
        return str(err)
    return None


def supervise(pid: int) -> None:
    """In C: wait for G (PID 1 of the namespace) and end the way it ended. Never returns."""
    os.closerange(0, 65536)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(70)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 70)


def _private_proc() -> None:
    libc = _libc()
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount proc")


def _reachable(uid: int, folders: dict[str, list[str]], write: list[str], devices: list[str]) -> str | None:
    """What `uid` could not use (a kind of folder, not its path: results must not differ from run to run).

    Tried with only the effective ids switched; None when everything is in reach.
    """
    folders = {kind: [p for p in paths if os.path.exists(p)] for kind, paths in folders.items()}   # as root
    with _effective(uid):
        for kind, paths in folders.items():
            if not all(os.access(p, os.R_OK | (os.X_OK if os.path.isdir(p) else 0), effective_ids=True)
                       for p in paths):
                return kind
        if not all(os.access(p, os.R_OK | os.W_OK | os.X_OK, effective_ids=True) for p in write):
            return "its scratch folder"
        if not all(os.access(p, os.R_OK | os.W_OK, effective_ids=True) for p in devices):
            return "the GPU's device files"
    return None


@contextlib.contextmanager
def _effective(uid: int):
    """Run a block with the effective uid and gid switched to `uid` (the real and saved ones stay root's)."""
    os.setresgid(-1, uid, -1)
    os.setresuid(-1, uid, -1)
    try:
        yield
    finally:
        os.setresuid(-1, 0, -1)
        os.setresgid(-1, 0, -1)


def _searchable_by(uid: int, folder: str) -> bool:
    """Whether `uid` may search this one folder (its own mode and ACL only, not the folders above it)."""
    fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
    try:
        with _effective(uid):
            return os.access(".", os.X_OK, dir_fd=fd, effective_ids=True)
    finally:
        os.close(fd)


def _ancestors(path: str) -> list[str]:
    """The folders above `path`, top down, without `/`."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def plan_exposure(roots: dict[str, bool], blocked: Callable[[str], bool]) -> list[tuple[str, str]]:
    """The mount steps that make every root reachable at its own path: ("tmpfs" | "dir" | "ro" | "rw", path).

    `roots` maps a real path to whether it is written (a scratch folder);
    `blocked(folder)` says whether the user cannot search that one folder of
    the host. The topmost such folder above a root is covered with an empty
    tmpfs, the folders down to the root are made in it, and the root is
    bound back from the host ("ro", or "rw" for a written one, also where it
    lies in a read-only root). Nothing is planned where nothing is blocked.
    """
    made: dict[str, str] = {}          # mount point -> what is mounted there
    created: set[str] = set()
    steps: list[tuple[str, str]] = []

    def owner(path: str) -> str | None:
        points = [point for point in made if _under(path, point)]
        return made[max(points, key=len)] if points else None

    for root in sorted(roots, key=lambda p: (p.count("/"), p)):
        for folder in _ancestors(root):
            if owner(folder) == "tmpfs":
                if folder not in created:
                    steps.append(("dir", folder))
                    created.add(folder)
            elif folder not in roots and blocked(folder):
                steps.append(("tmpfs", folder))
                made[folder] = "tmpfs"
                created.add(folder)
        want, where = ("rw" if roots[root] else "ro"), owner(root)
        if where == "tmpfs" or (where == "ro" and want == "rw"):
            steps.append((want, root))
            made[root] = want
    return steps


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = lambda text: None if text is None else text.encode()        # noqa: E731
    _check(_libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _carry_out(steps: list[tuple[str, str]], fds: dict[str, int]) -> list[str]:
    """Make the planned mounts (this namespace's only: / is private by now); returns the mount points, in order."""
    done: list[str] = []
    try:
        for kind, path in steps:
            if kind == "tmpfs":
                _mount("inferlab", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
                done.append(path)
            elif kind == "dir":
                os.mkdir(path)
                os.chmod(path, 0o755)
            else:
                if not os.path.lexists(path):                  # the mount point, in our tmpfs
                    if stat.S_ISDIR(os.fstat(fds[path]).st_mode):
                        os.mkdir(path)
                    else:
                        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
                _mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC, None)
                done.append(path)
                if kind == "ro":
                    kept = os.statvfs(path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
                    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept, None)
    except OSError:
        _undo(done)
        raise
    return done


def _undo(done: list[str]) -> None:
    for path in reversed(done):
        _libc().umount2(path.encode(), MNT_DETACH)


def expose(uid: int, roots: dict[str, bool]) -> list[str]:
    """Make every root reachable by `uid` at its own path, in this mount namespace only; returns the mount points.

    How: every folder above a root that `uid` cannot search (root's 0700
    home, where pyenv and conda put Python; pytest's 0700 temp folders) is
    covered by an empty tmpfs (mode 0755), and only the roots are bound back
    into it from the host (read-only, scratch read-write), at the paths they
    had, so no path a graded process is given changes and nothing on the host
    does either. Why not idmapped mounts or a copy: an idmapped mount needs a
    user namespace and a filesystem that supports it, and still leaves the
    0700 folder above in the way; a copy of Python costs gigabytes. The price:
    a tmpfs and a bind mount or two per item (the namespace goes with the
    item); inside a covered folder the graded process sees only the roots
    (the rest of root's home is gone for it, which is the point); and only the
    roots themselves are checked as readable by `uid`, not every file under
    them (an install with a file readable by its owner alone fails that
    import, with the error in the item's output).
    """
    steps = plan_exposure(roots, lambda folder: not _searchable_by(uid, folder))
    bound = [path for kind, path in steps if kind in ("ro", "rw")]
    fds = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in bound}   # the host's, before any cover
    try:
        return _carry_out(steps, fds)
    finally:
        for fd in fds.values():
            os.close(fd)


def _give(paths: list[str], uid: int) -> None:
    for top in paths:
        for folder, dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.lchown(name, uid, uid)


def _drop_capabilities() -> None:
    """uid 0 without any capability: no DAC override, no ptrace of the grader, no mount, no renice of others.

    The bounding set is emptied and no_new_privs set first, so that an exec
    (`--spawn fresh` execs the graded interpreter) cannot hand root its
    capabilities back.
    """
    _no_new_privileges()
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc().capset(header, data), "capset")


def _no_new_privileges() -> None:
    """Empty the bounding set and set no_new_privs: no exec (a set-uid program) can give privileges back."""
    libc = _libc()
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break                                             # EINVAL: past the last capability this kernel has
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def python_folders(hidden: list[str]) -> list[str]:
    """What the graded interpreter reads and runs: its prefixes, its binary's folder, its sys.path.

    A folder holding a hidden root (an editable install's path entry to the
    course repository) is left out: nothing there may be imported anyway.
    """
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), *(p for p in sys.path if p)]
    real = [os.path.realpath(p) for p in found if os.path.exists(p)]
    return list(dict.fromkeys(p for p in real if not any(_under(h, p) for h in hidden)))


def _choose_user(spec: dict, private_mounts: bool) -> dict:
    """uid 65534 where it reaches what the item needs (through mounts if it must); else uid 0, no capabilities.

    `private_mounts`: / is private to this namespace, so mounts made here never reach the host.
    """
    if os.geteuid() != 0:
        return {"uid": os.geteuid(), "missing": "the grader is not root: graded code runs as the grader's user"}
    uid = int(spec.get("uid", NOBODY))
    read = [os.path.realpath(p) for p in spec.get("read", []) if os.path.exists(p)]
    write = [os.path.realpath(p) for p in spec.get("write", []) if os.path.exists(p)]
    folders = {"Python's folders": python_folders(list(spec.get("hidden", []))), "the harness or the model": read}
    os.setgroups([])
    _give(write, uid)
    exposed, failed = [], ""
    if private_mounts and _reachable(uid, folders, write, []) is not None:
        try:
            roots = {**{p: False for paths in folders.values() for p in paths}, **{p: True for p in write}}
            exposed = expose(uid, roots)
        except OSError as err:
            failed = f" (mounting them failed: {err.strerror})"
    blocked = _reachable(uid, folders, write, list(spec.get("devices", [])))
    if blocked is None:
        _no_new_privileges()
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        kinds = [kind for kind, paths in [*folders.items(), ("its scratch folder", write)]
                 if any(p in exposed for p in paths)]
        return {"uid": uid, **({"exposed": kinds} if kinds else {})}
    _undo(exposed)
    _give(write, 0)
    _drop_capabilities()
    return {"uid": 0, "capabilities": "none",
            "missing": f"uid {uid} cannot reach {blocked}{failed}: runs as uid 0 with every capability dropped"}


def become_init(spec: dict) -> dict:
    """In G (PID 1 of the new namespace, still root): private /proc, then an unprivileged user. Returns a summary."""
    _check(_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    summary: dict = {"init": int(os.readlink("/proc/self")), "pid_namespace": os.stat("/proc/self/ns/pid").st_ino}
    try:
        _private_proc()
        summary["private_proc"] = True
    except OSError as err:
        summary["private_proc"] = False
        summary["missing"] = f"no private /proc ({err})"
    user = _choose_user(spec, summary["private_proc"])
    if "missing" in user and "missing" in summary:
        user["missing"] = summary["missing"] + "; " + user["missing"]
    summary.update(user)
    return summary


def reachable_by_others(path: str) -> bool:
    """Whether a user with no relation to the owners could read `path` (every folder above searchable)."""
    current = os.path.realpath(path)
    need = stat.S_IROTH | (stat.S_IXOTH if os.path.isdir(current) else 0)
    if os.stat(current).st_mode & need != need:
        return False
    while current != os.sep:
        current = os.path.dirname(current)
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return False
    return True


def members(pid_namespace: int) -> list[int]:
    """Host pids of the processes still in the PID namespace with this inode (the grader's /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}/ns/pid").st_ino == pid_namespace:
                found.append(int(name))
        except OSError:
            continue
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stopped(pid: int) -> bool:
    """Whether the process is stopped (state T) right now."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def launch(argv: list[str]) -> None:
    """The launcher: fence, report the summary on the given descriptor, exec the command. Never returns."""
    spec, fd, command = json.loads(argv[0]), int(argv[1]), argv[3:]
    error = enter()
    if error is not None:
        summary = {"pid_namespace": None, "init": os.getpid(), "missing": f"no PID namespace ({error})"}
    else:
        pid = os.fork()
        if pid != 0:
            supervise(pid)
        try:
            summary = become_init(spec)
        except BaseException as err:  # noqa: BLE001 - never run graded code half-fenced
            print(f"inferlab: process fence failed: {err!r}", file=sys.stderr, flush=True)
            os._exit(72)
    os.write(fd, json.dumps(summary).encode())
    os.close(fd)
    try:
        os.chdir(os.getcwd())            # the cwd by its path again: through this namespace's mounts, if any
    except OSError:
        pass
    os.execv(command[0], command)


if __name__ == "__main__":
    launch(sys.argv[1:])
