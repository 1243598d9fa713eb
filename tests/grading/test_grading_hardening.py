"""Issue 32's attacks on the grader, each a small synthetic lab 2 submission graded beside an honest classmate.

Each attack must score what honest work of the same content deserves (its
control: the same content without the trick), be named in its result, and
leave the classmate's 100 alone. The batch is graded at `-j 2` inside a small
tmpfs this test mounts, so the disk-fill attack can never reach the real disk
even if the scratch quota failed (the classmate would lose points instead, and
the test would fail). Needs a grader running as root, as the process fence does.
"""
from __future__ import annotations

import contextlib
import csv
import ctypes
import hashlib
import json
import os
import tempfile
import tracemalloc
from pathlib import Path

import jsonschema
import pytest

from grading.grade_run import RunOptions, grade_run
from grading.paths import SCHEMAS, golden_path
from grading.report import make_reports
from grading.results import stable_view
from grading.sample_submissions import solved, stubs, with_bodies, write_submission
from grading.scratch import Quota, Scratch, mounts_beneath
from grading.submission import extract, read_submission
from grading.tree_walk import Limits, read_tree
from grading.unfenced import Unfenced
from labkit.tree import PACKAGE, load_reference

LAB = "lab2"
CAP_S = 20.0
QUOTA = Quota(bytes=48 << 20, files=2000)
GOLDEN_FILE = str(golden_path(LAB))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs and runs the process fence: needs root")


@contextlib.contextmanager
def small_tmpfs(size_mib: int, prefix: str):
    """A folder on a tmpfs of its own (every user may search it), unmounted at the end, whatever is in it."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, f"size={size_mib}m,mode=0755".encode()) != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs")
    try:
        yield path
    finally:
        for point in mounts_beneath(path):
            libc.umount2(os.fsencode(point), 2)
        os.rmdir(path)


def deep_folder(parent: Path, depth: int) -> None:
    """`depth` nested folders (os.makedirs recurses, and fails long before 1,100)."""
    fd = os.open(parent, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


DISK_FILL = '''import os, tempfile
block = b"0" * (1 << 20)
for i in range(40):                      # 40 files of 64 MiB at most: bounded even if nothing stopped it
    try:
        with open(os.path.join(tempfile.gettempdir(), f"fill{i}.bin"), "wb") as out:
            for _ in range(64):
                out.write(block)
    except OSError:
        break
raise NotImplementedError("lab2.allocate")
'''

PROBE = '''import os
here = os.getcwd()
for path in (os.path.join(here, "probe.txt"), os.path.join(os.path.dirname(here), "submission", "probe.txt"),
             os.path.join(os.path.dirname(os.path.dirname(here)), "probe.txt")):
    try:
        open(path, "w").write("x")
    except Exception:
        pass
try:
    os.listdir(os.path.dirname(os.path.dirname(here)))
except Exception:
    pass
raise NotImplementedError("lab2.allocate")
'''

# Native routes to the golden file that the audit hook cannot see; without Landlock, the first used to score 100.
NATIVE_THEFT = f'''import json, os, importlib.machinery, importlib.util, tempfile, _json
import torch
golden = {GOLDEN_FILE!r}
size = os.path.getsize(golden)
stolen = []
def attempt(read):
    try:
        stolen.append(read())
    except Exception:
        pass
attempt(lambda: bytes(torch.ops.aten.from_file(golden, False, size, dtype=torch.uint8).tolist()).decode())
attempt(lambda: bytes(torch.ops.aten.from_file.default(golden, False, size, dtype=torch.uint8).tolist()).decode())
attempt(lambda: bytes(torch._C._jit_get_operation("aten::from_file")[0](golden, False, size).to(torch.uint8).tolist()).decode())
attempt(lambda: bytes(list(torch._C.StorageBase.from_file(golden, False, size))).decode())
attempt(lambda: bytes(list(torch.UntypedStorage.from_file(golden, True, size))).decode())
def wordpiece():
    lines = __import__("tokenizers").models.WordPiece.read_file(golden)
    return "\\n".join(sorted(lines, key=lines.get))
attempt(wordpiece)
def history():
    import readline
    readline.read_history_file(golden)
    return "\\n".join(readline.get_history_item(i + 1) for i in range(readline.get_current_history_length()))
attempt(history)
def extension():
    copy = os.path.join(tempfile.gettempdir(), "mine.so")
    with open(_json.__file__, "rb") as source, open(copy, "wb") as target:
        target.write(source.read())
    spec = importlib.util.spec_from_file_location("_json", copy,
                                                  loader=importlib.machinery.ExtensionFileLoader("_json", copy))
    return importlib.util.module_from_spec(spec)
attempt(extension)
for text in stolen:
    try:
        data = json.loads(text)
    except Exception:
        continue
    with open(os.environ["INFERLAB_OBSERVATIONS"], "a") as out:
        for test, obs in data["tests"].items():
            out.write(json.dumps({{"test": test, "obs": obs, "complete": True, "error": None}}) + "\\n")
    os._exit(0)
raise NotImplementedError("lab2.allocate")
'''


def body_submission(root: Path, student: str, tree, base, bodies: dict[str, str]) -> Path:
    fill = stubs(LAB) if base == "stubs" else solved(LAB)
    patch = with_bodies(bodies, tree)
    return write_submission(root, student, LAB, tree, lambda r: patch(r) if r.region_id in bodies else fill(r))


def result(out: Path, student: str) -> dict:
    return json.loads((out / f"{student}.json").read_text(encoding="utf-8"))


def has_flag(res: dict, text: str) -> bool:
    return any(text in flag for flag in res["flags"])


@pytest.fixture(scope="module")
def batch():
    """The class: an honest classmate and the attacks (`controls/` holds honest work to compare with, ungraded)."""
    tree = load_reference()
    with small_tmpfs(768, "inferlab-hardening-") as work:
        sub, out = work / "submitted", work / "results"
        write_submission(sub, "classmate", LAB, tree, solved(LAB))
        # a package folder that is a link to the classmate's
        write_submission(sub, "att_link_engine", LAB, tree, solved(LAB))
        engine = sub / "att_link_engine" / LAB / PACKAGE / "engine"
        for path in sorted(engine.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        engine.rmdir()
        engine.symlink_to(sub / "classmate" / LAB / PACKAGE / "engine")
        # the whole package a link into the grader's own reference copy (made under the results folder)
        (sub / "att_link_reference" / LAB).mkdir(parents=True)
        (sub / "att_link_reference" / LAB / PACKAGE).symlink_to(out / ".work" / "reference-harness" / PACKAGE)
        # a link inside the submission is followed: the package's engine/ is a link to a folder beside it
        folder = write_submission(sub, "inside_link", LAB, tree, stubs(LAB))
        (folder / PACKAGE / "engine").rename(folder / "my_engine")
        (folder / PACKAGE / "engine").symlink_to(Path("..") / "my_engine")
        write_submission(work / "controls", "stubs", LAB, tree, stubs(LAB))
        # 2,001 files that sort first, beside the code (which is changed later: the rerun must see it)
        folder = write_submission(sub, "att_many_files", LAB, tree, stubs(LAB))
        (folder / "aaa").mkdir()
        for i in range(2001):
            (folder / "aaa" / f"{i:04d}.txt").write_text("x")
        # one file name that is not UTF-8, and a folder nested 1,100 deep, beside the code
        folder = write_submission(sub, "att_bad_name", LAB, tree, stubs(LAB))
        with open(os.fsencode(folder / PACKAGE) + b"/notes\xff\xfe.py", "w") as handle:
            handle.write("# written by an old zip tool\n")
        folder = write_submission(sub, "att_deep", LAB, tree, stubs(LAB))
        deep_folder(folder, 1100)
        # a region file of 24 MB: correct code followed by 24 MB of comments
        folder = write_submission(sub, "att_big_module", LAB, tree, solved(LAB))
        module = folder / PACKAGE / "engine" / "block_manager.py"
        module.write_text(module.read_text() + ("# padding " * 100 + "\n") * 24_000)
        body_submission(sub, "att_disk", tree, "stubs", {"lab2.allocate": DISK_FILL})
        body_submission(sub, "att_probe", tree, "stubs", {"lab2.allocate": PROBE})
        options = RunOptions(LAB, sub, out, jobs=2, deadline_cap_s=CAP_S, quota=QUOTA)
        summary = grade_run(options, show_progress=False)
        yield {"work": work, "sub": sub, "out": out, "summary": summary, "tree": tree, "options": options}


def test_the_classmate_keeps_100_beside_every_attack(batch):
    res = result(batch["out"], "classmate")
    assert res["score"] == 100, [(i["id"], i["status"], i["message"]) for i in res["items"]]
    assert not res["flags"], res["flags"]
    assert not batch["summary"].errors and not batch["summary"].ungraded


def test_a_linked_engine_folder_scores_as_absent_and_is_flagged(batch):
    """Honest work without engine/ has no lab 2 code at all: every region missing, 0."""
    att = result(batch["out"], "att_link_engine")
    assert att["score"] == 0
    assert {r["status"] for r in att["regions"]} == {"missing"}
    assert att["files"][f"{PACKAGE}/engine"] == "symlink"
    assert not any(path.startswith(f"{PACKAGE}/engine/") for path in att["files"]), "the classmate's files were read"
    assert has_flag(att, f"{PACKAGE}/engine: a symbolic link to something outside the submission")


def test_a_package_linked_into_the_graders_reference_copy_scores_nothing(batch):
    att = result(batch["out"], "att_link_reference")
    assert att["score"] == 0 and {r["status"] for r in att["regions"]} == {"missing"}
    assert att["files"] == {PACKAGE: "symlink"} and has_flag(att, "outside the submission")


def same_package(res: dict, control: Path) -> bool:
    """The package was read whole: every file of the control's package, hashed here with hashlib."""
    package = {path.relative_to(control).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
               for path in (control / PACKAGE).rglob("*") if path.is_file()}
    return bool(package) and all(res["files"].get(k) == v for k, v in package.items())


def stub_control(batch) -> Path:
    return batch["work"] / "controls" / "stubs" / LAB


def read_as_stubs(res: dict) -> bool:
    """Graded as the untouched stubs are: 0, every region read and not attempted."""
    return res["score"] == 0 and {r["status"] for r in res["regions"]} == {"not attempted"}


def test_a_link_inside_the_submission_is_followed_once(batch):
    res = result(batch["out"], "inside_link")
    assert same_package(res, stub_control(batch)) and read_as_stubs(res)        # read through the link, not missing
    assert not res["flags"], res["flags"]
    assert any("a symbolic link inside the submission, followed" in note for note in res["notes"])


def test_a_name_that_is_not_utf8_is_reported_and_never_fatal(batch):
    res = result(batch["out"], "att_bad_name")
    assert same_package(res, stub_control(batch)) and read_as_stubs(res)
    assert res["files"][f"{PACKAGE}/notes\\xff\\xfe.py"] == "name-not-utf8"
    assert any("not valid UTF-8" in note for note in res["notes"])


def test_a_folder_1100_deep_is_cut_and_a_plain_rerun_still_works(batch):
    res = result(batch["out"], "att_deep")
    assert same_package(res, stub_control(batch)) and read_as_stubs(res)
    assert has_flag(res, "nested deeper than 32 levels")
    again = grade_run(RunOptions(LAB, batch["sub"], batch["out"], jobs=1, deadline_cap_s=CAP_S, quota=QUOTA,
                                 student="att_deep"), show_progress=False)
    assert again.skipped == ["att_deep"] and not again.graded


def test_a_24_mb_module_is_not_read_and_reading_it_stays_small(batch):
    res = result(batch["out"], "att_big_module")
    assert res["score"] == 0 and res["files"][f"{PACKAGE}/engine/block_manager.py"] == "too-large"
    assert has_flag(res, "over the limit for a Python module")
    folder = batch["sub"] / "att_big_module" / LAB
    tracemalloc.start()
    try:
        with tempfile.TemporaryDirectory() as copy:
            read_submission(folder, copy_to=Path(copy))
            extract(Path(copy) / PACKAGE, batch["tree"], LAB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"reading the submission peaked at {peak >> 20} MiB"


def test_filling_the_disk_hits_the_scratch_quota_not_the_disk(batch):
    res = result(batch["out"], "att_disk")
    assert res["score"] == 0
    assert has_flag(res, "filled its scratch quota (48 MiB or 2000 files)"), res["flags"]


def test_many_files_then_changed_code_a_plain_rerun_grades_the_change(batch):
    first = result(batch["out"], "att_many_files")
    assert same_package(first, stub_control(batch)) and read_as_stubs(first) and len(first["files"]) > 2001
    module = batch["sub"] / "att_many_files" / LAB / PACKAGE / "engine" / "block_manager.py"
    module.write_text(module.read_text().replace('raise NotImplementedError("lab2.allocate")',
                                                 'raise NotImplementedError("lab2.allocate, changed")'))
    again = grade_run(RunOptions(LAB, batch["sub"], batch["out"], jobs=1, deadline_cap_s=CAP_S, quota=QUOTA,
                                 student="att_many_files"), show_progress=False)
    assert again.graded == ["att_many_files"], "the rerun kept the old result"
    second = result(batch["out"], "att_many_files")
    assert second["files"][f"{PACKAGE}/engine/block_manager.py"] == hashlib.sha256(module.read_bytes()).hexdigest()


def test_grading_the_same_folder_twice_gives_the_same_results(batch):
    """The probe's refusals name the harness and the results folder: as placeholders, the same both times."""
    first = result(batch["out"], "att_probe")
    assert has_flag(first, "sandbox refused: open '<results>/.work/att_probe/harness/probe.txt'"), first["flags"]
    again = batch["work"] / "again"
    grade_run(RunOptions(LAB, batch["sub"], again, jobs=2, deadline_cap_s=CAP_S, quota=QUOTA, student="att_probe"),
              show_progress=False)
    second = json.loads((again / "att_probe.json").read_text())
    assert stable_view(second) == stable_view(first)


def test_results_validate_and_every_student_has_a_row(batch):
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "result.schema.json").read_text()))
    students = sorted(p.name for p in batch["sub"].iterdir())
    for student in students:
        errors = [e.message for e in validator.iter_errors(result(batch["out"], student))]
        assert not errors, (student, errors[:3])
    paths = make_reports(batch["out"], batch["work"] / "report")
    rows = list(csv.DictReader(open(paths.csv, encoding="utf-8")))
    assert sorted(r["student_id"] for r in rows) == students


def test_without_landlock_grading_is_refused_unless_allowed():
    with pytest.raises(Unfenced) as refused:
        grade_run(RunOptions(LAB, Path("/nonexistent"), Path("/nonexistent-out"), landlock=False), show_progress=False)
    assert "--allow-unfenced" in str(refused.value) and "TorchScript" in str(refused.value)
    assert not Path("/nonexistent-out").exists()


def test_without_landlock_torchs_native_readers_are_closed_and_flagged():
    tree = load_reference()
    with small_tmpfs(256, "inferlab-unfenced-") as work:
        body_submission(work / "submitted", "att_native", tree, "stubs", {"lab2.allocate": NATIVE_THEFT})
        out = work / "results"
        grade_run(RunOptions(LAB, work / "submitted", out, jobs=1, deadline_cap_s=CAP_S, landlock=False,
                             allow_unfenced=True), show_progress=False)
        att = result(out, "att_native")
        assert att["score"] == 0 and att["environment"]["sandbox"]["landlock"] is None
        for route in ("torch.from_file", "torch.UntypedStorage.from_file (a shared memory map",
                      "torch.UntypedStorage.from_file '<course>", "WordPiece.read_file", "import 'readline'",
                      "import '_json from"):
            assert has_flag(att, f"sandbox refused: {route}"), (route, att["flags"])


# -- the walk and the quota on their own ------------------------------------------------------------

def test_the_walk_keeps_to_its_limits(tmp_path):
    root = tmp_path / "sub"
    (root / PACKAGE / "engine").mkdir(parents=True)
    (root / PACKAGE / "engine" / "a.py").write_text("x = 1\n")
    (root / PACKAGE / "engine" / "big.py").write_text("#" * 3000)
    (root / "report.md").write_text("r" * 5000)
    (root / "zz").mkdir()
    for i in range(30):
        (root / "zz" / f"{i}.txt").write_text("z")
    os.mkfifo(root / "pipe")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    small = Limits(entries=20, total_bytes=4000, file_bytes=6000, module_bytes=2000, depth=3)
    reading = read_tree(root, small)
    assert reading.hashes[f"{PACKAGE}/engine/big.py"] == "too-large"
    assert reading.hashes["report.md"] == "not-read"                     # over the total, not over one file
    assert reading.hashes["pipe"] == "not-regular"
    assert not any(path.startswith((".git", "zz/")) for path in reading.hashes)   # hidden; too many entries
    assert len(reading.hashes[f"{PACKAGE}/engine/a.py"]) == 64
    assert any("held more entries than the 20" in flag for flag in reading.flags)
    assert any("in all: report.md and 0 later file(s) were not read" in flag for flag in reading.flags)


def test_the_package_is_read_first_whatever_lies_beside_it(tmp_path):
    root = tmp_path / "sub"
    (root / PACKAGE).mkdir(parents=True)
    (root / PACKAGE / "m.py").write_text("x = 1\n")
    for i in range(50):
        (root / f"a{i:02d}.txt").write_text("a")
    reading = read_tree(root, Limits(entries=10))
    assert f"{PACKAGE}/m.py" in reading.hashes and not any(p.startswith("a") for p in reading.hashes)


def test_the_scratch_quota_without_the_kernel_kills_the_writer():
    import subprocess
    import sys
    with small_tmpfs(64, "inferlab-poll-") as work:
        quota = Quota(bytes=8 << 20, files=1000, kernel=False)
        with Scratch(work / "scratch", quota) as space:
            writer = subprocess.Popen([sys.executable, "-c", "import time\nfor i in range(48):\n"
                                       f"    open('{work}/scratch/f%d' % i, 'wb').write(b'0' * (1 << 20))\n"
                                       "    time.sleep(0.02)\ntime.sleep(30)"])
            space.watch(writer.kill)
            writer.wait(20)
            flag = space.over()
        assert not space.kernel and writer.returncode == -9
        assert flag and flag.startswith("wrote more than its scratch quota (8 MiB or 1000 files")


def test_the_kernel_quota_refuses_writes_past_it(tmp_path):
    with Scratch(tmp_path / "scratch", Quota(bytes=4 << 20, files=100)) as space:
        assert space.kernel and str(tmp_path / "scratch") in mounts_beneath(tmp_path)
        with pytest.raises(OSError):
            (tmp_path / "scratch" / "big").write_bytes(b"0" * (8 << 20))
        assert space.over().startswith("filled its scratch quota")
    assert not (tmp_path / "scratch").exists() and not mounts_beneath(tmp_path)


# -- one bad submission, and what feedback shows ----------------------------------------------------

def test_one_bad_submission_never_stops_the_class(monkeypatch):
    """At -j 1: a grader exception, a result written only on the second try, one never written; the rest graded."""
    import grading.grade_run as run_module
    from inferlab.cli import main
    tree = load_reference()
    real_grade, real_write = run_module.grade_submission, run_module.write_json_atomic
    tries: dict[str, int] = {}

    def grade(sub, shared, runner):
        if sub.student_id == "a_boom":
            raise RuntimeError("injected grader failure")
        return real_grade(sub, shared, runner)

    def write(path, data):
        tries[path.stem] = tries.get(path.stem, 0) + 1
        if path.stem == "c_lost" or (path.stem == "b_unwritable" and tries[path.stem] == 1):
            raise OSError(28, "No space left on device (injected)")
        return real_write(path, data)

    monkeypatch.setattr(run_module, "grade_submission", grade)
    monkeypatch.setattr(run_module, "write_json_atomic", write)
    with small_tmpfs(128, "inferlab-class-") as work:
        for student in ("a_boom", "b_unwritable", "c_lost", "d_after"):
            write_submission(work / "submitted", student, LAB, tree, stubs(LAB))
        out = work / "results"
        code = main(["grade", "run", "--lab", LAB, "--submissions", str(work / "submitted"), "--out", str(out),
                     "-j", "1"])
        assert code == 1
        assert "injected grader failure" in result(out, "a_boom")["items"][0]["message"]
        assert "while writing its result" in result(out, "b_unwritable")["items"][0]["message"]
        assert not (out / "c_lost.json").exists()
        after = result(out, "d_after")
        assert after["score"] == 0 and {i["status"] for i in after["items"]} == {"failed"}
        rows = {r["student_id"]: r for r in csv.DictReader(open(make_reports(out).csv, encoding="utf-8"))}
        assert {sid: r["status"] for sid, r in rows.items()} == {"a_boom": "error", "b_unwritable": "error",
                                                                  "c_lost": "error", "d_after": "graded"}


def _leaves(value, found: set[str]) -> set[str]:
    """The strings (8 characters or more) and floats in an observation, as feedback would print them."""
    if isinstance(value, dict):
        for item in value.values():
            _leaves(item, found)
    elif isinstance(value, list):
        for item in value:
            _leaves(item, found)
    elif isinstance(value, str) and len(value) >= 8:
        found.add(value)
    elif isinstance(value, float):
        found.add(json.dumps(value))
    return found


def test_lab1_feedback_shows_no_value_that_only_the_reference_observed():
    """What the mutants themselves observe is recorded again, by the grader's own runner, as the independent
    side: no value of a hidden test that only the reference observed may appear in feedback or on Gradescope."""
    from courseware.bugzoo import load_mutants
    from grading.execute import Fence, Runner
    from grading.golden import load_golden, model_dir
    from grading.harness import harness_package, write_harness
    from labkit.rubric import load_rubric
    lab, chosen = "lab1", ("step_counts_sequences_as_tokens", "tpot_over_all_tokens")   # whose old feedback leaked
    tree, rubric, golden = load_reference(), load_rubric("lab1"), load_golden("lab1")
    mutants = {m.name: m for m in load_mutants(lab=lab)}
    with small_tmpfs(256, "inferlab-feedback-") as work:
        for name in chosen:
            write_submission(work / "submitted", name, lab, tree, mutants[name].choice(tree))
        out = work / "results"
        grade_run(RunOptions(lab, work / "submitted", out, jobs=2, deadline_cap_s=60), show_progress=False)
        paths = make_reports(out, work / "report")
        runner = Runner(work / "runner")
        try:
            for name in chosen:
                res = result(out, name)
                failed = [item for item in res["items"] if item["status"] == "failed" and item["tests"]]
                assert failed, name
                shown = ((paths.feedback / f"{name}.md").read_text(encoding="utf-8")
                         + (paths.gradescope / name / "results.json").read_text(encoding="utf-8"))
                extraction = extract(work / "submitted" / name / lab / PACKAGE, tree, lab)
                harness = write_harness(work / f"harness-{name}", lab,
                                        harness_package(lab, tree, extraction.bodies, extraction.additions))
                fence = Fence.for_run(model_dir(), work / "submitted", out)
                for item in failed:
                    run = runner.observe(harness, work / "scratch", list(rubric.item(item["id"]).select), 60, fence)
                    for test in golden["items"][item["id"]]:
                        record = run.records.get(test) or {}
                        only_theirs = _leaves(golden["tests"][test], set()) - _leaves(record.get("obs", []), set())
                        leaked = sorted(value for value in only_theirs if value in shown)
                        assert not leaked, (name, item["id"], test, leaked[:3])
                assert "yours" in shown or "BAD" in shown, "the feedback shows what the student's engine did"
        finally:
            runner.close()
