"""The grader's fence hides the whole course repository by default, and lets a graded process read only
its harness, the model and Python.

Checked with the fence's own rule (`read_allowed`, the function the audit hook
and the native-reader guards apply) on the policy a real item gets.
"""
from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

from labkit.labs import ROOT, all_labs
from grading.execute import Fence
from grading.paths import HARNESS_PACKAGE, private_modules
from grading.payload._inferlab_sandbox import Policy, read_allowed


def policy_for(tmp_path: Path) -> tuple[Policy, Path]:
    harness, scratch, model = tmp_path / "harness", tmp_path / "scratch", tmp_path / "model"
    for folder in (harness, scratch, model):
        folder.mkdir()
    fence = Fence.for_run(model, tmp_path / "submissions")
    return Policy(str(scratch), fence.readable(harness), list(fence.hidden), private_modules()), harness


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.split()
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]


def test_every_tracked_top_level_folder_is_hidden(tmp_path):
    policy, _ = policy_for(tmp_path)
    first_file: dict[str, str] = {}
    for rel in tracked_files():
        if "/" in rel:
            first_file.setdefault(rel.split("/", 1)[0], rel)
    assert {"reference", "assignments", "grading", "courseware", "tests"} <= set(first_file)
    readable = [rel for rel in first_file.values() if read_allowed(policy, ROOT / rel)]
    assert not readable, f"graded code could read {readable}"
    assert not read_allowed(policy, ROOT / "a_folder_added_next_year" / "x.py")


def test_every_private_part_of_every_lab_is_hidden(tmp_path):
    policy, _ = policy_for(tmp_path)
    parts = [path for lab in all_labs() for part in lab.private_parts()
             for path in ([part] if part.is_file() else sorted(part.rglob("*")))]
    assert any(p.name == "golden.json" for p in parts) and any("hidden" in p.parts for p in parts)
    assert any("private" in p.parts for p in parts) and any("bugzoo" in p.parts for p in parts)
    readable = [str(p.relative_to(ROOT)) for p in parts if read_allowed(policy, p)]
    assert not readable, f"graded code could read {readable}"


def test_the_harness_the_model_and_python_stay_readable(tmp_path):
    policy, harness = policy_for(tmp_path)
    assert read_allowed(policy, harness / "conftest.py")
    assert read_allowed(policy, tmp_path / "model" / "config.json")
    assert read_allowed(policy, Path(sysconfig.get_paths()["stdlib"]) / "os.py")
    torch_file = Path(__import__("torch").__file__)
    assert read_allowed(policy, torch_file), f"{torch_file} (Python's own libraries, even in a venv in the repo)"
    assert not read_allowed(policy, tmp_path / "submissions" / "alice" / "x.py")


def test_every_course_package_but_the_harness_one_is_unimportable():
    modules = private_modules()
    assert {"reference", "courseware", "grading", "inferlab", "tests", "scripts", "slides_code"} <= set(modules)
    assert HARNESS_PACKAGE not in modules   # the harness imports its own copy by that name


def test_only_the_programs_a_gpu_policy_allows_may_be_started(tmp_path):
    """On GPU machines Triton's compilers may run (Policy.programs), by path or by a name PATH resolves to them;
    any other program is refused, and one that does not exist fails as it would unfenced (FileNotFoundError,
    which libraries that probe for optional tools expect), with nothing flagged."""
    import shutil
    import sys
    from grading.paths import PAYLOAD
    allowed, other = shutil.which("true"), shutil.which("echo")
    script = f"""
import subprocess, sys
sys.path.insert(0, {str(PAYLOAD)!r})
from _inferlab_sandbox import Policy, install
install(Policy({str(tmp_path)!r}, [], [], [], programs=[{allowed!r}]))
print("allowed", subprocess.run([{allowed!r}]).returncode)
for argv in ([{other!r}, "x"], ["true"], ["inferlab-no-such-program", "--version"]):
    try:
        subprocess.run(argv)
        print("started", argv[0])
    except FileNotFoundError:
        print("missing", argv[0])
    except PermissionError:
        print("refused", argv[0])
"""
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:4] == ["allowed 0", f"refused {other}", "started true",
                                          "missing inferlab-no-such-program"], out.stdout + out.stderr
    assert out.stderr.count("INFERLAB-SANDBOX-DENIED subprocess.Popen") == 1, out.stderr


def test_a_gpu_fence_names_the_compilers_and_a_cpu_fence_nothing(tmp_path):
    import shutil
    cpu, gpu = Fence.for_run(tmp_path), Fence.for_run(tmp_path, gpu=True)
    assert cpu.programs == () and cpu.devices == ()
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is None or compiler in gpu.programs
    nvcc = shutil.which("nvcc")
    assert nvcc is None or nvcc in gpu.programs


def test_paths_relative_to_a_directory_descriptor_are_judged_where_they_point(tmp_path):
    """shutil.rmtree (Triton's temp-folder clean-up) unlinks entries relative to a folder's descriptor: inside
    scratch that is allowed and flags nothing; the same call aimed at the harness is refused."""
    import sys
    from grading.paths import PAYLOAD
    scratch, readable = tmp_path / "scratch", tmp_path / "harness"
    (scratch / "tmp" / "build" / "sub").mkdir(parents=True)
    for name in ("tmp/build/__triton_launcher.c", "tmp/build/sub/x.so"):
        (scratch / name).write_text("x")
    readable.mkdir()
    (readable / "kept.py").write_text("")
    script = f"""
import os, shutil, sys
sys.path.insert(0, {str(PAYLOAD)!r})
from _inferlab_sandbox import Policy, install
install(Policy({str(scratch)!r}, [{str(readable)!r}], [], []))
os.chdir({str(readable)!r})
shutil.rmtree({str(scratch / "tmp" / "build")!r})
print("rmtree", os.path.exists({str(scratch / "tmp" / "build")!r}))
fd = os.open({str(readable)!r}, os.O_RDONLY)
try:
    os.unlink("kept.py", dir_fd=fd)
    print("removed")
except PermissionError:
    print("refused")
"""
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["rmtree False", "refused"], out.stdout + out.stderr
    assert (readable / "kept.py").exists()
    assert out.stderr.count("INFERLAB-SANDBOX-DENIED") == 1, out.stderr
