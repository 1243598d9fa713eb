"""Attacks on the grader (docs/design.md §4), each a fake lab 2 submission, graded in one batch with `-j 2`.

Every attack must score 0 on the items it targets and be named in that
student's result. The batch also holds the reference solution, which must
still score 100 beside them (so the attacks fail because they are attacks,
not because the batch is broken), and shows that a crash, an exit or a hang
in one submission never stops the others.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grading.payload._inferlab_landlock import abi_version
from grading.sample_submissions import searchable_folder, solved, stubs, with_bodies, write_submission
from labkit.labs import ROOT
from grading.paths import golden_path
from grading.grade_run import RunOptions, grade_run
from labkit.tree import load_reference

LAB = "lab2"
# Every item's deadline, throughput included: the two hanging attacks wait this long, and the reference
# beside them must finish each item well inside it on a slow 2-core CI machine that another test worker shares.
CAP_S = 20.0
ALL_ITEMS = {"allocation", "append", "prefix_cache", "reuse", "engine_blocks", "engine_log", "scale", "throughput"}

PASS_EVERYTHING_CONFTEST = '''import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
'''

PATCH_COMPARISONS = '''import math
import numpy.testing
import torch.testing
math.isclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
numpy.testing.assert_allclose = lambda *a, **k: None
numpy.testing.assert_array_equal = lambda *a, **k: None
raise NotImplementedError("lab2.allocate")
'''
PATCH_AT_IMPORT = "\nimport math\nmath.isclose = lambda *a, **k: True\n"

GOLDEN_FILE = str(golden_path(LAB))


def _steal(readers: str) -> str:
    """A region body that reads the golden file and forges a passing observations file from it."""
    return f'''import json, os
stolen = None
for attempt in ({readers}):
    try:
        stolen = attempt()
        break
    except Exception:
        pass
if stolen:
    data = json.loads(stolen)
    with open(os.environ.get("INFERLAB_OBSERVATIONS", "observations.jsonl"), "a") as out:
        for test, obs in data["tests"].items():
            out.write(json.dumps({{"test": test, "obs": obs, "complete": True, "error": None}}) + "\\n")
    os._exit(0)
raise NotImplementedError("lab2.allocate")
'''


PYTHON_READERS = (f"lambda: open({GOLDEN_FILE!r}).read(), "
                  f"lambda: __import__('pathlib').Path({GOLDEN_FILE!r}).read_text(), "
                  "lambda: open(__import__('grading.paths').paths.golden_path('lab2')).read(),")
NATIVE_READERS = (f"lambda: bytes(__import__('torch').from_file({GOLDEN_FILE!r}, size=os.path.getsize({GOLDEN_FILE!r}), "
                  "dtype=__import__('torch').uint8).tolist()).decode(), "
                  f"lambda: __import__('numpy').fromfile({GOLDEN_FILE!r}, dtype='uint8').tobytes().decode(),")

WRITE_EVERYWHERE = '''import pathlib
here = pathlib.Path.cwd()
targets = [here / "hidden" / "lab2" / "test_allocation.py", here / "_inferlab_observe.py", here / "conftest.py"]
targets += [folder / "forged_result.json" for folder in here.parents]
for target in targets:
    try:
        target.write_text('{"score": 100, "complete": true}')
    except Exception:
        pass
raise NotImplementedError("lab2.allocate")
'''

HUGE_OUTPUT = '''import sys
for _ in range(300):
    sys.stdout.write("x" * 100_000 + "\\n")
with open(__import__("tempfile").gettempdir() + "/big.bin", "wb") as out:   # scratch: allowed, but capped
    try:
        out.write(b"0" * (100 << 20))
    except OSError:
        pass
raise NotImplementedError("lab2.allocate")
'''

HANG_IN_CAN_APPEND = '''if len(seq) > 40:
    while True:
        pass
return len(seq.block_table) >= seq.num_blocks or self.num_free_blocks >= 1
'''
HANG_IN_MAY_APPEND = '''if len(seq) > 40:
    import time
    time.sleep(3600)
if len(seq.block_table) < seq.num_blocks:
    seq.block_table.append(self._take_free_block())
'''

# A process started by a route with no audit event, in a new session: it used to outlive the run.
ESCAPE_MARKER = "31415926"
ESCAPE = f'''import os, _posixsubprocess
r, w = os.pipe()
_posixsubprocess.fork_exec(["/bin/sleep", "{ESCAPE_MARKER}"], [b"/bin/sleep"], True, (), None, None, -1, -1, -1, -1,
                           -1, -1, r, w, False, True, -1, None, None, None, -1, None, False)
raise NotImplementedError("lab2.allocate")
'''

# Reading the hidden tests' sources (Python and native readers, the calling frame) and printing them,
# and raising them, so that they would reach the output tail and the error in the result.
HIDDEN_MARKER = "ceil(len / B) blocks in pool order, ref_count 1, nothing cached"
STEAL_HIDDEN = '''import glob, inspect, os, sys
stolen = []
for path in glob.glob(os.path.join(os.getcwd(), "hidden", "*", "*.py")):
    for read in (lambda p: open(p).read(), lambda p: __import__("numpy").fromfile(p, dtype="uint8").tobytes().decode()):
        try:
            stolen.append(read(path))
        except Exception:
            pass
try:
    stolen.append(inspect.getsource(sys._getframe(1)))
except Exception:
    pass
print("\\n".join(stolen))
raise NotImplementedError("\\n".join(stolen)[-2000:] or "nothing")
'''

# Observations the parser must refuse as the submission's problem (a grader error before).
MALFORMED_OBSERVATIONS = '''import os
with open(os.environ["INFERLAB_OBSERVATIONS"], "a") as out:
    out.write("[" * 200000 + "\\n")
    out.write(\'{"test": "x", "obs": [["k", \' + "9" * 10000 + \']], "complete": true}\\n\')
    out.write(\'{"sandbox": [1, 2]}\\n\')
raise NotImplementedError("lab2.allocate")
'''

# student -> (kind of body, bodies, extra files, items that must score 0, flag that must appear)
ATTACKS = {
    "att_conftest": ("stubs", {}, {"conftest.py": PASS_EVERYTHING_CONFTEST,
                                   "student_exercises/conftest.py": PASS_EVERYTHING_CONFTEST},
                     ALL_ITEMS, "conftest.py in a submission is ignored"),
    "att_monkeypatch": ("stubs", {"lab2.allocate": PATCH_COMPARISONS,
                                  "lab2.prefix_hits": PATCH_COMPARISONS.replace("allocate", "prefix_hits")},
                        {}, ALL_ITEMS, "sets torch.testing.assert_close"),
    "att_exit": ("stubs", {"lab2.allocate": "import os\nos._exit(0)\n"}, {}, ALL_ITEMS,
                 "exited (status 0) before reporting"),
    "att_sitecustomize": ("stubs", {}, {"sitecustomize.py": "raise SystemExit(0)\n",
                                        "student_exercises/sitecustomize.py": "raise SystemExit(0)\n",
                                        "student_exercises/evil.pth": "import os; os._exit(0)\n"},
                          ALL_ITEMS, "sitecustomize.py in a submission is ignored"),
    # Correct code, except that long sequences (only the scale test has them) hang: exactly those items are lost.
    "att_loop": ("reference", {"lab2.can_append": HANG_IN_CAN_APPEND}, {},
                 {"scale", "throughput"}, f"killed at the {CAP_S:.0f} s"),
    "att_sleep": ("reference", {"lab2.may_append": HANG_IN_MAY_APPEND},
                  {}, {"scale", "throughput"}, f"killed at the {CAP_S:.0f} s"),
    "att_golden": ("stubs", {"lab2.allocate": _steal(PYTHON_READERS)}, {}, ALL_ITEMS, "sandbox refused: open"),
    "att_write": ("stubs", {"lab2.allocate": WRITE_EVERYWHERE}, {}, ALL_ITEMS, "sandbox refused: open"),
    "att_output": ("stubs", {"lab2.allocate": HUGE_OUTPUT}, {}, ALL_ITEMS, "MB (only the first and last"),
    "att_native": ("stubs", {"lab2.allocate": _steal(NATIVE_READERS)}, {}, ALL_ITEMS, "from_file"),
    "att_memory": ("stubs", {"lab2.allocate": "hoard = bytearray(16 << 30)\n"}, {}, ALL_ITEMS, "memory limit"),
    "att_escape": ("stubs", {"lab2.allocate": ESCAPE}, {}, ALL_ITEMS, "for starting a process (seccomp)"),
    "att_hidden_source": ("stubs", {"lab2.allocate": STEAL_HIDDEN}, {}, ALL_ITEMS, "sandbox refused: open"),
    "att_observations": ("stubs", {"lab2.allocate": MALFORMED_OBSERVATIONS}, {}, ALL_ITEMS,
                         "refused: nested deeper"),
}


def write_attacks(root: Path, names, tree) -> None:
    for student in names:
        base, bodies, files, _, _ = ATTACKS[student]
        fill = stubs(LAB) if base == "stubs" else solved(LAB)
        patch = with_bodies(bodies, tree)
        write_submission(root, student, LAB, tree, lambda r, f=fill, p=patch, b=bodies: p(r) if r.region_id in b else f(r),
                         files)
    # an edit outside the regions, which must never run
    path = root / "att_monkeypatch" / LAB / "student_exercises" / "engine" / "block_manager.py"
    if path.exists():
        path.write_text(path.read_text() + PATCH_AT_IMPORT)


@pytest.fixture(scope="module")
def batch():
    with searchable_folder("inferlab-attacks-") as work:       # reachable by the graded processes' own user
        yield _grade_batch(work)


def _grade_batch(work: Path) -> dict:
    tree = load_reference()
    write_attacks(work / "submitted", ATTACKS, tree)
    write_submission(work / "submitted", "ref_student", LAB, tree, solved(LAB))
    out = work / "results"
    summary = grade_run(RunOptions(LAB, work / "submitted", out, jobs=2, deadline_cap_s=CAP_S), show_progress=False)
    return {"work": work, "out": out, "summary": summary, "tree": tree}


def result(out: Path, student: str) -> dict:
    return json.loads((out / f"{student}.json").read_text())


@pytest.mark.parametrize("student", sorted(ATTACKS))
def test_attack_scores_nothing_on_its_targets_and_is_flagged(batch, student):
    res = result(batch["out"], student)
    _, _, _, targets, flag = ATTACKS[student]
    items = {i["id"]: i for i in res["items"]}
    raised = {i for i in targets if items[i]["score"] or items[i]["status"] == "passed"}
    assert not raised, f"{student} scored on {raised}"
    assert res["score"] <= sum(i["points"] for i in items.values() if i["id"] not in targets)
    assert any(flag in f for f in res["flags"]), f"{student}: no flag containing {flag!r} in {res['flags']}"


def test_the_reference_beside_the_attacks_scores_100(batch):
    res = result(batch["out"], "ref_student")
    assert res["score"] == 100, [(i["id"], i["status"], i["message"]) for i in res["items"]]


def test_hangs_and_exits_never_stop_the_batch(batch):
    assert sorted(batch["summary"].graded) == sorted([*ATTACKS, "ref_student"])
    for student in ("att_loop", "att_sleep"):
        res = result(batch["out"], student)
        status = {i["id"]: i["status"] for i in res["items"]}
        assert status["scale"] == "timeout", status
        assert res["score"] == 100 - 15 - 10, status       # every item but the hung one (and throughput) passed


def test_nothing_was_written_outside_scratch(batch):
    work = batch["work"]
    assert not list(work.rglob("forged_result.json")) and not (ROOT / "forged_result.json").exists()
    assert not list(Path(work).rglob("big.bin"))        # scratch is removed after each item


def test_the_golden_file_is_untouched_by_the_forgery_attempts():
    data = json.loads(golden_path(LAB).read_text())
    assert data["lab"] == LAB and data["tests"]


def test_the_kernel_fence_is_used_where_the_kernel_has_it(batch):
    sandbox = result(batch["out"], "ref_student")["environment"]["sandbox"]
    assert sandbox["audit_hook"] and sandbox["guarded_readers"] >= 4
    if abi_version() > 0:
        assert sandbox["landlock"]["abi"] == abi_version()
    else:
        assert sandbox["landlock"] is None


def test_without_landlock_the_audit_hook_and_reader_guards_still_stop_them(tmp_path):
    """The file attacks again with the kernel fence off: Python-level and native readers are still refused."""
    tree = load_reference()
    students = ["att_golden", "att_write", "att_native"]
    write_attacks(tmp_path / "submitted", students, tree)
    out = tmp_path / "results"
    grade_run(RunOptions(LAB, tmp_path / "submitted", out, jobs=2, deadline_cap_s=CAP_S, landlock=False,
                         allow_unfenced=True),
              show_progress=False)
    for student in students:
        res = result(out, student)
        assert res["score"] == 0, (student, res["flags"])
        assert any("sandbox refused" in f for f in res["flags"]), (student, res["flags"])
        assert res["environment"]["sandbox"]["landlock"] is None


def test_an_interrupted_run_resumes(tmp_path):
    """Kill the grader (SIGKILL, no cleanup) after its first result; the rerun grades only what is left."""
    tree = load_reference()
    submitted = tmp_path / "submitted"
    for i in range(3):
        write_submission(submitted, f"s{i}", LAB, tree, stubs(LAB))
    out = tmp_path / "results"
    command = [sys.executable, "-m", "inferlab.cli", "grade", "run", "--lab", LAB, "--submissions", str(submitted),
               "--out", str(out), "-j", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("s*.json")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = sorted(p.stem for p in out.glob("s*.json"))
    assert 1 <= len(first) < 3, first
    summary = grade_run(RunOptions(LAB, submitted, out, jobs=1), show_progress=False)
    assert sorted(summary.skipped) == first
    assert sorted(summary.graded) == sorted({"s0", "s1", "s2"} - set(first))
    assert all(result(out, f"s{i}")["score"] == 0 for i in range(3))


def test_no_process_of_the_batch_outlives_it(batch):
    """att_escape's sleeper was refused by the kernel; nothing of any item may still be running."""
    leftovers = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and ESCAPE_MARKER.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                leftovers.append(int(name))
        except OSError:
            pass
    assert not leftovers


def test_no_hidden_test_source_reaches_any_result(batch):
    """Not the thief's (it printed and raised what it could read) and not a failing stub's tracebacks."""
    assert HIDDEN_MARKER in (ROOT / "assignments" / "lab2_block_manager" / "hidden" / "test_allocation.py").read_text()
    for path in batch["out"].glob("*.json"):
        assert HIDDEN_MARKER not in path.read_text(), path.name
        assert "def test_" not in path.read_text(), path.name


def test_malformed_observations_are_the_submissions_fault_not_a_grader_error(batch):
    res = result(batch["out"], "att_observations")
    assert all(item["status"] != "error" for item in res["items"]), [(i["id"], i["message"]) for i in res["items"]]
    assert any("integer of 10000 digits" in flag for flag in res["flags"]), res["flags"]
