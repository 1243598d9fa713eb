"""Graded code runs as uid 65534 even where Python and the harness sit below folders closed to that user.

On the development machine Python lives under root's 0700 home (pyenv) and
pytest's temp folders are 0700: the graded process used to stay uid 0 (with
no capabilities) there. `grading.process_fence.expose` now covers such
folders inside the item's mount namespace and binds back only what the item
needs. The first test grades a probe, written as a hidden test of a real lab 2
harness under pytest's temp folder, through the grader's own path
(`Runner.observe`, with the fence of a real run); the rest check the mount
plan itself, including that nothing is mounted where nothing is closed (CI:
Python in /usr, readable by all).
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from labkit.tree import load_reference
from labkit.labs import ROOT
from courseware.tiny_model import ensure_tiny_model
from grading import execute
from grading.execute import SANDBOX_UID, Fence, Runner
from grading.harness import build_harness
from grading.paths import golden_path
from grading import process_fence

SECRET_NAME = "INFERLAB_GRADER_SECRET"

PROBE = '''import os, sys

GRADER = {grader}
SECRET = {secret!r}
TARGETS = {targets!r}


def outcome(read):
    try:
        data = read()
    except Exception as err:
        return type(err).__name__
    return "read, with the secret" if SECRET.encode() in data else "read"


def test_probe(observe):
    observe("ids", [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()])
    import torch, transformers
    from student_exercises.engine import block_manager
    observe("imports", [torch.__name__, transformers.__name__, block_manager.__name__])
    with open(os.path.join(os.environ["INFERLAB_GRADING_MODEL"], "config.json"), "rb") as handle:
        observe("model", len(handle.read()) > 0)
    scratch = os.path.dirname(os.environ["INFERLAB_OBSERVATIONS"])
    with open(os.path.join(scratch, "left_behind.txt"), "w") as handle:
        handle.write("x")
    locked = os.path.join(scratch, "locked")
    os.mkdir(locked)
    with open(os.path.join(locked, "inside.txt"), "w") as handle:
        handle.write("x")
    os.chmod(locked, 0o500)
    observe("environment", SECRET in os.environ or any(SECRET in v for v in os.environ.values()))
    observe("/proc/1 is", os.getpid())
    observe("/proc/1/environ", outcome(lambda: open("/proc/1/environ", "rb").read()))
    observe("the grader's environ", outcome(lambda: open(f"/proc/{{GRADER}}/environ", "rb").read()))
    observe("hidden", {{path: outcome(lambda: open(path, "rb").read()) for path in TARGETS}})
    observe("hidden listing", outcome(lambda: str(os.listdir({root!r})).encode()))
'''


@pytest.fixture(scope="module", params=["fork", "fresh"])
def probed(request, tmp_path_factory):
    """The probe's observations, the fence the grader saw, and the scratch folder before and after cleaning.

    Through the fork server and through `--spawn fresh`'s launcher (which execs the interpreter as uid 65534).
    """
    if os.geteuid() != 0:
        pytest.skip("the uid drop needs a grader running as root")
    work = tmp_path_factory.mktemp("unprivileged")        # below pytest's 0700 folder
    secret = secrets.token_hex(16)
    os.environ[SECRET_NAME] = secret                     # the grader's environment holds a secret
    try:
        harness = build_harness(work / "harness", "lab2", load_reference())
        targets = [str(golden_path("lab2")), str(ROOT / "grading" / "execute.py"), str(ROOT / "README.md"),
                   str(Path.home() / ".bashrc")]
        probe = PROBE.format(grader=os.getpid(), secret=secret, targets=targets, root=str(ROOT))
        (harness / "hidden" / "lab2" / "test_probe.py").write_text(probe)
        fence = Fence.for_run(ensure_tiny_model(), work)
        runner = Runner(work / "run", spawn=request.param)
        scratch = work / "scratch"
        left = scratch / "left_behind.txt"
        before = {}
        read_observations = execute.read_observations

        def read_and_look(path):
            """What the item left, seen by the grader where it reads the observations (scratch goes after)."""
            before.update({"owner": left.stat().st_uid if left.exists() else None,
                           "readable": left.read_text() if left.exists() else None})
            return read_observations(path)

        try:
            execute.read_observations = read_and_look
            run = runner.observe(harness, scratch, ["hidden/lab2/test_probe.py"], 120, fence)
        finally:
            execute.read_observations = read_observations
            runner.close()
        return {"run": run, "before": before, "after": scratch.exists(), "secret": secret}
    finally:
        del os.environ[SECRET_NAME]


def observations(probed) -> dict:
    records = probed["run"].records
    key = "hidden/lab2/test_probe.py::test_probe"
    assert key in records, probed["run"].child.output.text()[-3000:]
    assert records[key]["complete"], records[key]["error"]
    return dict(records[key]["obs"])


@pytest.mark.slow
def test_the_graded_process_runs_as_nobody(probed):
    fence = probed["run"].child.fence
    assert fence["uid"] == SANDBOX_UID and "missing" not in fence, fence
    assert "the harness or the model" in fence["exposed"]     # its harness sits below pytest's 0700 folder
    assert observations(probed)["ids"] == [SANDBOX_UID, SANDBOX_UID, SANDBOX_UID, SANDBOX_UID, []]


@pytest.mark.slow
def test_it_imports_its_libraries_and_harness_reads_the_model_and_writes_scratch(probed):
    obs = observations(probed)
    assert obs["imports"] == ["torch", "transformers", "student_exercises.engine.block_manager"]
    assert obs["model"] is True
    assert probed["before"] == {"owner": SANDBOX_UID, "readable": "x"}     # the grader reads what it wrote


@pytest.mark.slow
def test_what_it_left_in_scratch_is_removed_afterwards(probed):
    assert probed["after"] is False


@pytest.mark.slow
def test_it_reads_neither_the_graders_environment_nor_the_hidden_roots(probed):
    obs = observations(probed)
    assert obs["environment"] is False
    assert obs["/proc/1 is"] == 1                        # /proc/1 is the graded process itself, not the host's init
    assert obs["/proc/1/environ"] in ("read", "PermissionError")
    assert obs["the grader's environ"] in ("PermissionError", "FileNotFoundError")   # the fence, or not in its /proc
    assert set(obs["hidden"].values()) <= {"PermissionError", "FileNotFoundError"}, obs["hidden"]
    assert obs["hidden listing"] == "PermissionError"
    assert probed["secret"] not in json.dumps(obs)


def test_nothing_is_mounted_where_nothing_is_closed():
    roots = {"/usr/lib/python3.11": False, "/opt/venv/lib/python3.11/site-packages": False,
             "/tmp/run/harness": False, "/tmp/run/scratch": True}
    assert process_fence.plan_exposure(roots, lambda folder: False) == []


def test_a_closed_home_is_covered_and_only_the_needed_folders_come_back():
    closed = {"/root", "/tmp/pytest-of-root"}
    roots = {"/root/.pyenv/versions/3.11.7": False, "/root/.pyenv/versions/3.11.7/lib/python3.11": False,
             "/work/venv/lib/python3.11/site-packages": False, "/tmp/pytest-of-root/p/harness": False,
             "/tmp/pytest-of-root/p/harness/scratch": True}
    assert process_fence.plan_exposure(roots, lambda folder: folder in closed) == [
        ("tmpfs", "/root"), ("dir", "/root/.pyenv"), ("dir", "/root/.pyenv/versions"),
        ("ro", "/root/.pyenv/versions/3.11.7"),
        ("tmpfs", "/tmp/pytest-of-root"), ("dir", "/tmp/pytest-of-root/p"), ("ro", "/tmp/pytest-of-root/p/harness"),
        ("rw", "/tmp/pytest-of-root/p/harness/scratch"),      # written, though inside a read-only root
    ]


def test_a_closed_folder_that_is_itself_needed_is_never_covered():
    """The user cannot read it: the fence must see that and fall back, not hide its contents."""
    roots = {"/srv/model": False, "/srv/model/sub": False}
    assert process_fence.plan_exposure(roots, lambda folder: folder in {"/srv/model"}) == []


FALLBACK_PROBE = """import os, sys
print("REPORT", os.getuid(), sorted(os.listdir(sys.argv[1])) == sys.argv[2].split(","), flush=True)
"""


@pytest.mark.slow
def test_where_a_needed_folder_or_device_is_closed_it_stays_uid_0_and_mounts_nothing(tmp_path):
    """A harness that is itself 0700, or a GPU device file only root may open: uid 0 without capabilities.

    The covers made for Python are undone then: the process sees root's home as it is.
    """
    if os.geteuid() != 0:
        pytest.skip("the uid drop needs a grader running as root")
    import time
    from grading.spawn import ForkServer, base_env
    home = str(Path.home())
    listing = ",".join(sorted(os.listdir(home)))
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "probe.py").write_text(FALLBACK_PROBE)
    device = tmp_path / "nvidia0"
    device.write_text("")
    device.chmod(0o600)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    server = ForkServer()
    try:
        seen = {}
        for name, extra in (("harness", {}), ("device", {"devices": [str(device)]})):
            read = [str(closed)] if name == "harness" else [str(closed / "probe.py")]
            spec = {"uid": SANDBOX_UID, "read": read, "write": [str(scratch)], **extra}
            child = server.start("script", [str(closed / "probe.py"), home, listing], Path("/"), base_env(), fence=spec)
            result = child.wait(time.monotonic() + 60)
            seen[name] = (result.fence, result.output.text())
    finally:
        server.close()
    assert "cannot reach the harness or the model" in seen["harness"][0]["missing"], seen["harness"]
    assert "cannot reach the GPU's device files" in seen["device"][0]["missing"], seen["device"]
    for fence, output in seen.values():
        assert fence["uid"] == 0 and fence["capabilities"] == "none" and "exposed" not in fence
        assert "REPORT 0 True" in output, output
    assert scratch.stat().st_uid == 0                   # handed back to root


MOUNTS_PROBE = """import json, os
print("REPORT " + json.dumps([os.getuid(), [line.split()[:2] for line in open("/proc/self/mounts")]]))
"""


@pytest.mark.slow
def test_with_python_readable_by_all_nothing_extra_is_mounted():
    """CI's case: a system Python every user may read and a searchable harness: uid 65534, no mount but /proc.

    Run through the launcher `--spawn fresh` uses, with the system's own Python (standard library only).
    """
    import shutil
    import subprocess
    from grading import scratch
    from grading.sample_submissions import searchable_folder
    system = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or system is None or not process_fence.reachable_by_others(system):
        pytest.skip("needs root and a Python in /usr that every user may read")
    with searchable_folder("inferlab-fast-path-") as work:
        (work / "scratch").mkdir()
        (work / "probe.py").write_text(MOUNTS_PROBE)
        spec = {"uid": SANDBOX_UID, "read": [str(work)], "write": [str(work / "scratch")]}
        read, write = os.pipe()
        out = subprocess.run([system, "-I", "-B", process_fence.__file__, json.dumps(spec), str(write), "--",
                              system, "-I", str(work / "probe.py")], pass_fds=(write,), capture_output=True,
                             text=True, timeout=60)
        os.close(write)
        with os.fdopen(read) as handle:
            fence = json.loads(handle.read())
    uid, inside = json.loads(out.stdout.split("REPORT ", 1)[1])
    host = [line.split()[:2] for line in Path("/proc/self/mounts").read_text().splitlines()]
    # Scratch tmpfs that other tests' graders mount and unmount meanwhile (pytest -n) come and go.
    inside, host = ([where for source, where in mounts if source != scratch.MOUNT_SOURCE] for mounts in (inside, host))
    assert fence["uid"] == uid == SANDBOX_UID and "exposed" not in fence, (fence, out.stderr)
    assert sorted(inside) == sorted([*host, "/proc"])        # its own /proc, nothing else
