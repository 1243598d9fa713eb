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
- G gives up root: uid/gid 65534 when every folder the item needs is reachable
  by that user (checked with the effective uid switched, before the switch is
  made for good); otherwise it stays uid 0 with every capability dropped (the
  model usually sits in root's 0700 home), and the summary says so. Its
  scratch folder is handed to the user it runs as.
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

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
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


def _reachable(uid: int, folders: dict[str, list[str]], write: list[str]) -> str | None:
    """What `uid` could not use (a kind of folder, not its path: results must not differ from run to run).

    Tried with only the effective uid switched; None when everything is in reach.
    """
    folders = {kind: [p for p in paths if os.path.exists(p)] for kind, paths in folders.items()}   # as root
    os.setresgid(-1, uid, -1)
    os.setresuid(-1, uid, -1)
    try:
        for kind, paths in folders.items():
            if not all(os.access(p, os.R_OK | os.X_OK, effective_ids=True) for p in paths):
                return kind
        if not all(os.access(p, os.R_OK | os.W_OK | os.X_OK, effective_ids=True) for p in write):
            return "its scratch folder"
        return None
    finally:
        os.setresuid(-1, 0, -1)
        os.setresgid(-1, 0, -1)


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
    libc = _libc()
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break                                             # EINVAL: past the last capability this kernel has
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")


def _choose_user(spec: dict) -> dict:
    if os.geteuid() != 0:
        return {"uid": os.geteuid(), "missing": "the grader is not root: graded code runs as the grader's user"}
    uid = int(spec.get("uid", NOBODY))
    folders = {"Python's folders": [p for p in sys.path if p], "the harness or the model": list(spec.get("read", []))}
    write = list(spec.get("write", []))
    _give(write, uid)
    blocked = _reachable(uid, folders, write)
    if blocked is None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        return {"uid": uid}
    _give(write, 0)
    _drop_capabilities()
    return {"uid": 0, "capabilities": "none",
            "missing": f"uid {uid} cannot reach {blocked}: runs as uid 0 with every capability dropped"}


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
    user = _choose_user(spec)
    if "missing" in user and "missing" in summary:
        user["missing"] = summary["missing"] + "; " + user["missing"]
    summary.update(user)
    return summary


def reachable_by_others(path: str) -> bool:
    """Whether a user with no relation to the owners could read `path` (every folder above searchable)."""
    import stat
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
    os.execv(command[0], command)


if __name__ == "__main__":
    launch(sys.argv[1:])
