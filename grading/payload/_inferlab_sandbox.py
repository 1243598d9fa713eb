"""The fence around graded code, installed inside the graded process before any student code runs.

Copied into every harness as `_inferlab_sandbox.py`; standard library only (it
must never import the `grading` package: that is where the golden outputs live).

Three layers, all impossible to remove once in place:

1. Landlock (`_inferlab_landlock`), where the kernel has it: reads only beneath
   the Python installation, system folders, the harness and the model; writes
   only beneath this item's scratch folder; no signals to the grader.
2. seccomp (`_inferlab_seccomp`): the kernel kills the process that tries to
   start another one by any route (`_posixsubprocess`, native code, ...); not on a GPU
   item, which must start Triton's compilers (`Policy.programs`: exactly those).
3. A Python audit hook (PEP 578): refuses starting processes, signals, sockets,
   ctypes, reading the hidden tests' sources (compiled before the fence),
   importing the instructor's packages (`reference`, `grading`,
   `bugzoo`) or modules that reach files or native code without an audit
   event (`NATIVE_MODULES`), loading an extension module from outside
   Python's folders, reading the hidden roots (golden outputs, results, other
   submissions, the instructor's sources), writing outside scratch, symlinks,
   `chdir` out of the harness and scratch, and relative paths with `..` (which
   could be resolved against a directory descriptor the hook cannot see).

Every refusal raises PermissionError in the graded code and writes one line
`INFERLAB-SANDBOX-DENIED <event> <detail>` to the process's stderr, which the
grader reads to name the attempt in the student's result (a use that is
allowed but worth a look writes `INFERLAB-SANDBOX-NOTED ...` instead). Scoring
never depends on those lines: the verdict is computed elsewhere.
"""
from __future__ import annotations

import json
import os
import sys

ENV = "INFERLAB_SANDBOX"
DENIED_TAG = "INFERLAB-SANDBOX-DENIED"
NOTED_TAG = "INFERLAB-SANDBOX-NOTED"        # allowed, but worth a TA's look: a native file reader was used

# Modules that reach files or native code without any audit event: readline's history loaders read any text
# file line by line, cffi calls any C function. No engine needs them; refused at import like the course's own.
NATIVE_MODULES = ("readline", "cffi", "_cffi_backend")

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# Events refused outright once the sandbox is in place.
_FORBIDDEN = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "os.startfile", "pty.spawn",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
    "ctypes.cdata/buffer", "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at",
    "ctypes.PyObj_FromPtr", "ctypes.set_errno", "ctypes.set_exception",
    "os.symlink", "os.link", "os.chroot", "resource.setrlimit", "resource.prlimit",
    "sys._current_frames", "sys.remote_exec", "os.setxattr", "os.removexattr",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "winreg.OpenKey", "webbrowser.open", "urllib.Request", "http.client.connect", "ftplib.connect",
    "smtplib.connect", "imaplib.open", "poplib.connect", "telnetlib.Telnet.open",
})
# Process starts an allowed program (Policy.programs) may make; all others stay forbidden.
_SPAWNING = frozenset({"subprocess.Popen", "os.posix_spawn", "os.posix_spawnp"})
# Where a mutating event carries the dir_fd its relative path(s) are taken from (CPython's audit arguments):
# position of the first path's dir_fd, then of the second path's.
_DIR_FD_ARGS = {"os.remove": (1,), "os.rmdir": (1,), "os.mkdir": (2,), "os.chmod": (2,), "os.chown": (3,),
                "os.utime": (3,), "os.rename": (2, 3), "os.mkfifo": (2,), "os.mknod": (3,)}
# Events whose first argument is a path that may only be changed inside scratch.
_MUTATING = frozenset({"os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod", "os.chown", "os.utime",
                       "os.mkdir", "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod", "shutil.rmtree",
                       "shutil.move", "shutil.copyfile", "shutil.copytree", "shutil.chown", "shutil.make_archive",
                       "shutil.unpack_archive"})
_LISTING = frozenset({"os.listdir", "os.scandir", "glob.glob", "glob.glob/2", "os.walk", "os.fwalk"})


class Policy:
    """Which roots the graded process may read, write, or not even look at."""

    def __init__(self, scratch: str, readable: list[str], hidden: list[str], modules: list[str],
                 secret: list[str] | None = None, programs: list[str] | None = None,
                 devices: list[str] | None = None):
        self.scratch = os.path.realpath(scratch)
        self.readable = [os.path.realpath(p) for p in readable]
        self.secret = [os.path.realpath(p) for p in secret or []]       # inside readable, yet never read
        self.hidden = [os.path.realpath(p) for p in hidden]
        self.modules = tuple(modules) + NATIVE_MODULES
        # Only on CUDA machines: Triton compiles kernels with its ptxas and their launchers with the C
        # compiler, so exactly those executables may be started (under Landlock they inherit the fence),
        # and the GPU's device files may be opened read-write. Empty everywhere else.
        self.programs = frozenset(os.path.realpath(p) for p in programs or ())
        self.devices = [os.path.realpath(p) for p in devices or ()]

    @classmethod
    def from_env(cls) -> "Policy":
        data = json.loads(os.environ.pop(ENV))
        return cls(data["scratch"], data["readable"], data["hidden"], data["modules"], data.get("secret"),
                   data.get("programs"), data.get("devices"))


def _within(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def plain_path(path) -> str:
    """A path as an exact `str`: a str or bytes subclass could answer `startswith` or `decode` one way to the
    check and hand its own characters to the kernel, which never calls those methods."""
    value = os.fspath(path)
    if isinstance(value, bytes):
        return str(value, "utf-8", "surrogateescape")
    return "".join([value])


def read_allowed(policy: Policy, path) -> bool:
    """The hook's read rule as a function, for wrappers around native file readers."""
    try:
        full = os.path.realpath(plain_path(path))
    except TypeError:
        return True
    if _within(full, policy.secret):
        return False
    if _within(full, [policy.scratch]) or _within(full, policy.readable):
        return True
    return not _within(full, policy.hidden)


def split_around(roots: list[str], secret: list[str]) -> tuple[list[str], list[str]]:
    """Read roots for Landlock with the secret folders cut out: (readable whole, listable only).

    Landlock grants rights beneath a folder and cannot take them back below
    it, so a root holding a secret folder is granted listing only, and each of
    its entries that is not (and holds no) secret is granted whole, down to
    the secret folder itself, which stays listable: pytest walks it to collect.
    """
    full: list[str] = []
    list_only: list[str] = []
    pending = list(roots)
    while pending:
        root = pending.pop()
        if not any(s == root or s.startswith(root.rstrip(os.sep) + os.sep) for s in secret):
            full.append(root)
            continue
        list_only.append(root)
        if root in secret or not os.path.isdir(root):
            continue
        pending += [os.path.join(root, name) for name in sorted(os.listdir(root))]
    return full, list_only


NATIVE_EVENT = "inferlab.native"


def install(policy: Policy, landlock_read_roots: list[str] | None = None, code_roots: list[str] | None = None,
            natives: dict | None = None, quiet: list[str] | None = None) -> dict:
    """Fence this process. Returns what was put in place (recorded in the observations file).

    `code_roots`: folders extension modules may be loaded from besides the
    readable roots (Python's sys.path and the system's library folders).
    `natives`: name -> a library's native file reader, which from now on only
    the hook holds; the library's attribute is a trampoline that raises
    `NATIVE_EVENT` (see `_install_hook`). `quiet`: folders whose reads
    through those readers are the engine's own (the model), never noted.
    """
    summary: dict = {"audit_hook": True, "landlock": None, "seccomp": None, "programs": sorted(policy.programs)}
    if landlock_read_roots is not None:
        try:
            import _inferlab_landlock
            full, list_only = split_around(landlock_read_roots + policy.readable, policy.secret)
            summary["landlock"] = _inferlab_landlock.restrict(full, [policy.scratch], list_only, policy.devices)
        except OSError as err:
            summary["landlock"] = {"error": str(err)}
    if policy.programs:
        # A GPU item must start Triton's ptxas and a C compiler: the kernel filter would kill it. The audit hook
        # still allows exactly those programs, and Landlock still fences what they read and write.
        summary["seccomp"] = {"skipped": "a GPU item may start the compilers Triton needs"}
    else:
        try:
            import _inferlab_seccomp
            summary["seccomp"] = _inferlab_seccomp.restrict()
        except OSError as err:
            summary["seccomp"] = {"error": str(err)}
    _install_hook(policy, [os.path.realpath(p) for p in code_roots or []], dict(natives or {}),
                  [os.path.realpath(p) for p in quiet or []])
    return summary


def _install_hook(policy: Policy, code_roots: list[str], natives: dict, quiet: list[str]) -> None:
    """Put up the audit hook. It alone holds the originals of the guarded native readers (`natives`).

    A Python wrapper around a reader would hold the original, and graded code
    could take it from the wrapper's closure and call it unchecked. So the
    library's attribute is a trampoline that raises the audit event
    `NATIVE_EVENT` with its arguments; the hook checks every path among them
    by the read rule and calls the original itself. Audit hooks cannot be
    listed or removed from Python, and the gc's introspection is refused, so
    nothing else reaches the originals. Raising the event by hand gets the
    same checks.
    """
    # Bind everything the hook uses now: graded code may replace module attributes later.
    realpath, join, fspath, getcwd = os.path.realpath, os.path.join, os.fspath, os.getcwd
    write, isdir, pid = os.write, os.path.isdir, os.getpid()
    fsdecode, sep, pardir, exists = os.fsdecode, os.sep, os.pardir, os.path.exists
    native_event, noted_tag = NATIVE_EVENT, NOTED_TAG
    # Builtins and this module's helpers too: graded code may replace `builtins.isinstance` or `_within`.
    import builtins
    within = _within
    isinstance, hasattr, str, tuple, type, dict, list, repr = (
        builtins.isinstance, builtins.hasattr, builtins.str, builtins.tuple, builtins.type, builtins.dict,
        builtins.list, builtins.repr)
    join_plain = "".join

    def plain(path) -> str:
        """`plain_path`, with everything it uses bound now."""
        value = fspath(path)
        if isinstance(value, bytes):
            return str(value, "utf-8", "surrogateescape")
        return join_plain([value])

    scratch, readable, hidden, modules = policy.scratch, list(policy.readable), list(policy.hidden), policy.modules
    secret = list(policy.secret)
    code = [*readable, *(root for root in code_roots if not within(root, hidden) and not within(root, [scratch]))]
    in_scratch = [scratch]
    forbidden, mutating, listing = _FORBIDDEN, _MUTATING, _LISTING
    programs, spawning = policy.programs, _SPAWNING
    isfile, executable_mode, environ, pathsep = os.path.isfile, os.X_OK, os.environ, os.pathsep
    access = os.access
    write_flags, dir_fds, readlink = _WRITE_FLAGS, _DIR_FD_ARGS, os.readlink
    proc_prefix = "/proc/"
    own_proc = (f"/proc/{pid}", "/proc/self", "/proc/thread-self")

    def deny(event: str, detail: str) -> None:
        line = f"{DENIED_TAG} {event} {detail[:300]!r}\n".encode("utf-8", "replace")
        try:
            write(2, line)
        except OSError:
            pass
        raise PermissionError(f"inferlab grader: {event} {detail[:200]} is not allowed while grading")

    def resolve(event: str, path, dir_fd=None) -> str | None:
        """The absolute path an event touches: relative to `dir_fd` where the call passed one, else to cwd."""
        if isinstance(path, int) or path is None:
            return None                                      # an open descriptor: checked when it was opened
        text = plain(path)
        if not text.startswith(sep) and pardir in text.split(sep):
            deny(event, text)                                # could be relative to a hidden directory's fd
        if isinstance(dir_fd, int) and not text.startswith(sep):
            try:
                base = readlink(f"/proc/self/fd/{dir_fd}")  # shutil.rmtree removes a folder's entries this way
            except OSError:
                deny(event, f"{text} (relative to descriptor {dir_fd})")
            return realpath(join(base, text))
        return realpath(join(getcwd(), text))

    def check_read(event: str, full: str) -> None:
        if within(full, secret):
            deny(event, full)
        if within(full, in_scratch) or within(full, readable):
            return
        if within(full, hidden):
            deny(event, full)
        if full.startswith(proc_prefix):
            rest = full[len(proc_prefix):].split(sep, 1)[0]
            if rest.isdigit() and not full.startswith(own_proc):
                deny(event, full)                              # another process's memory or environment

    def check_write(event: str, full: str) -> None:
        if within(full, in_scratch) or full == "/dev/null":
            return
        deny(event, full)

    def locate(event: str, args: tuple) -> str | None:
        """The program a spawn event would run (resolved as the OS would), or None where there is none.

        Popen(executable, args, cwd, env) and posix_spawn[p](path, argv, env):
        a bare name is looked up on PATH (the child's env if given), a path
        relative to cwd. A program that does not exist is answered with the
        FileNotFoundError the spawn itself would raise, not a refusal, because
        libraries probe for optional tools that way (torch's inductor asks for
        `nvcc --version` and carries on without it): nothing would have run.
        """
        name = args[0] if args else None
        if name is None and len(args) > 1 and isinstance(args[1], (list, tuple)) and args[1]:
            name = args[1][0]
        if not isinstance(name, (str, bytes)) and not hasattr(name, "__fspath__"):
            return None
        text = fsdecode(fspath(name))
        if sep in text:
            cwd = args[2] if event == "subprocess.Popen" and len(args) > 2 and args[2] is not None else None
            candidates = [join(fsdecode(fspath(cwd)), text) if cwd is not None else join(getcwd(), text)]
        else:
            env = args[-1] if event != "subprocess.Popen" else (args[3] if len(args) > 3 else None)
            search = env.get("PATH", env.get(b"PATH")) if isinstance(env, dict) else None
            search = fsdecode(search) if search is not None else environ.get("PATH", "")
            candidates = [join(folder or ".", text) for folder in search.split(pathsep)]
        for candidate in candidates:
            if isfile(candidate) and access(candidate, executable_mode):
                return realpath(candidate)
        return None

    def check_spawn(event: str, args: tuple) -> None:
        """Allow exactly the policy's programs; a program that does not exist fails as it would unfenced."""
        target = locate(event, args)
        if target is None:
            raise FileNotFoundError(2, "No such file or directory (inferlab grader: no such program)",
                                    repr(args[:1])[:200])
        if target not in programs:
            deny(event, repr(args)[:200])

    def native(args: tuple) -> None:
        """A guarded native reader: every path argument checked (and passed on as an exact str), then the call."""
        name, call_args, call_kwargs, box = (tuple(args) + (None,) * 4)[:4]
        original = natives.get(name) if isinstance(name, str) else None
        if original is None or type(call_args) is not tuple or type(call_kwargs) is not dict or type(box) is not list:
            deny(native_event, repr(name)[:100])
        checked = []
        for value in [*call_args, *call_kwargs.values()]:
            if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
                value = plain(value)
                full = resolve(name, value)
                check_read(name, full)
                if exists(full) and not within(full, quiet):
                    try:
                        write(2, f"{noted_tag} {name} {full[:300]!r}\n".encode("utf-8", "replace"))
                    except OSError:
                        pass
            checked.append(value)
        box.append(original(*checked[:len(call_args)], **dict(zip(call_kwargs, checked[len(call_args):]))))

    def hook(event: str, args: tuple) -> None:
        if event == native_event:
            native(args)
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            full = resolve(event, path)
            if full is None:
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing:
                check_write(event, full)
            else:
                check_read(event, full)
                if isinstance(flags, int) and mode is None and isdir(full) and not (
                        within(full, in_scratch) or within(full, readable)):
                    deny(event, full + " (directory descriptor)")
        elif event == "import":
            name = args[0] if args else ""
            if isinstance(name, str) and name.split(".", 1)[0] in modules:
                deny(event, name)
            origin = args[1] if len(args) > 1 else None
            if isinstance(origin, (str, bytes)) or hasattr(origin, "__fspath__"):
                # An extension module loaded from a file (`_imp.create_dynamic`): native code, so only from
                # Python's own folders (scratch too on a GPU item: Triton loads the launchers it builds there).
                full = resolve(event, origin)
                if full is not None and not (within(full, code) or (programs and within(full, in_scratch))):
                    deny(event, f"{name} from {full}")
        elif event == "sqlite3.connect":
            database = args[0] if args else None
            if database not in (None, ":memory:", "", b":memory:", b""):
                full = resolve(event, database)        # sqlite creates the file: a write
                if full is not None:
                    check_write(event, full)
        elif event in spawning:
            check_spawn(event, args)
        elif event in forbidden:
            deny(event, repr(args)[:200])
        elif event == "os.chdir":
            target = args[0] if args else None
            full = resolve(event, target)
            if full is not None and not (within(full, in_scratch) or within(full, readable)):
                deny(event, full)
        elif event in mutating:
            for position, arg in enumerate(args[:2]):
                if isinstance(arg, (str, bytes)) or hasattr(arg, "__fspath__"):
                    where = dir_fds.get(event, ())
                    fd = args[where[position]] if position < len(where) and where[position] < len(args) else None
                    full = resolve(event, arg, fd)
                    if full is not None:
                        check_write(event, full)
        elif event in listing:
            if args and (isinstance(args[0], (str, bytes)) or hasattr(args[0], "__fspath__")):
                full = resolve(event, args[0])
                if full is not None and not within(full, secret):      # names of hidden tests are no secret
                    check_read(event, full)

    sys.addaudithook(hook)
