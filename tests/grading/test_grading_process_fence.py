"""The process fence of an item (grading/process_fence.py), tested on both spawners directly.

These children run plain scripts, without the payload's seccomp filter, so
they can start processes the way an attack in a submission would try to
(`_posixsubprocess.fork_exec` with a new session raises no audit event): the
PID namespace alone must still end every one of them with the item, and the
child must see neither the grader's processes nor its privileges.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from grading.execute import SANDBOX_UID
from grading.spawn import ForkServer, FreshSpawner, base_env
from grading.sample_submissions import searchable_folder

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the process fence needs a grader running as root")]

ESCAPE = '''import json, os, sys, time, _posixsubprocess
marker = sys.argv[1]
r, w = os.pipe()
pid = _posixsubprocess.fork_exec(["/bin/sleep", marker], [b"/bin/sleep"], True, (), None, None, -1, -1, -1, -1,
                                 -1, -1, r, w, False, True, False, None, None, None, -1, None, False)
status = open("/proc/self/status").read()
cap_eff = [line.split()[1] for line in status.splitlines() if line.startswith("CapEff")][0]
seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
stolen = []
for name in ("environ", "cmdline"):
    try:
        stolen.append(open(f"/proc/{sys.argv[2]}/{name}", "rb").read()[:50].decode("latin-1"))
    except OSError as err:
        stolen.append(type(err).__name__)
print("REPORT " + json.dumps({"uid": os.getuid(), "pid": os.getpid(), "cap_eff": cap_eff, "seen": seen,
                              "child": pid, "stolen": stolen}), flush=True)
if sys.argv[3] == "hang":
    time.sleep(600)
'''


def _sleepers(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module", params=["fork", "fresh"])
def runs(request):
    """Two items that start a setsid sleeper: one ends on its own, one is killed at its deadline."""
    out = {}
    with searchable_folder("inferlab-fence-") as work:
        server = ForkServer() if request.param == "fork" else FreshSpawner(work)
        try:
            script = work / "escape.py"
            script.write_text(ESCAPE)
            for how in ("exit", "hang"):
                (work / how).mkdir()
                marker = str(31_415_900 + len(how) + 10 * (request.param == "fresh"))
                child = server.start("script", [str(script), marker, str(os.getpid()), how], work, base_env(),
                                     fence={"uid": SANDBOX_UID, "read": [str(work)], "write": [str(work / how)]})
                result = child.wait(time.monotonic() + (30 if how == "exit" else 4))
                line = next(x for x in result.output.text().splitlines() if x.startswith("REPORT "))
                out[how] = (result, json.loads(line[len("REPORT "):]), marker)
        finally:
            server.close()
    return out


@pytest.mark.parametrize("how", ["exit", "hang"])
def test_a_process_that_left_the_session_ends_with_its_item(runs, how):
    result, report, marker = runs[how]
    assert report["child"] > 0                      # it did start (no seccomp here): the namespace must end it
    assert result.timed_out == (how == "hang")
    assert _sleepers(marker) == [] and result.survivors == 0


def test_the_item_sees_only_its_own_processes_and_no_privilege(runs):
    result, report, _ = runs["exit"]
    assert result.fence["pid_namespace"] and result.fence["private_proc"]
    assert report["pid"] == 1 and set(report["seen"]) <= {1, report["child"]}
    assert report["stolen"] == ["FileNotFoundError", "FileNotFoundError"]   # the grader's pid is not in its /proc
    assert int(report["cap_eff"], 16) == 0
    assert result.fence["uid"] == report["uid"] == SANDBOX_UID, result.fence   # wherever Python sits (process_fence.expose)


def test_a_model_out_of_the_users_reach_is_read_from_a_root_owned_copy(tmp_path):
    from grading import process_fence
    from grading.execute import shared_model
    private = tmp_path / "home"
    (private / "model").mkdir(parents=True)
    (private / "model" / "config.json").write_text('{"marker": "%s"}' % tmp_path.name)
    private.chmod(0o700)
    copy = shared_model(private / "model")
    try:
        assert copy != private / "model" and process_fence.reachable_by_others(str(copy))
        assert (copy / "config.json").read_text() == (private / "model" / "config.json").read_text()
        assert copy.stat().st_uid == 0 and not copy.stat().st_mode & 0o022
        copy.chmod(0o777)                      # as if someone else had made (or could change) it: not trusted
        assert shared_model(private / "model") == private / "model"
    finally:
        import shutil
        shutil.rmtree(copy, ignore_errors=True)
