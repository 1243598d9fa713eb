"""The fork server's children must see the settings their own environment gives, not the zygote's."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ZYGOTE = Path(__file__).resolve().parents[2] / "grading" / "zygote.py"


def load_zygote():
    spec = importlib.util.spec_from_file_location("_zygote_under_test", ZYGOTE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inductor_compile_threads_follow_the_childs_environment(monkeypatch):
    """A config imported before the child's environment (as in the zygote) is re-read from that environment."""
    config = pytest.importorskip("torch._inductor.config")
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")     # what a GPU item's environment says
    with config.patch(compile_threads=7):                        # what the zygote's own environment decided
        load_zygote().reread_import_time_settings()
        threads = config.compile_threads
    assert threads == 1, "a GPU item would start inductor's worker pool, which the fence refuses"


def test_without_the_setting_the_config_is_left_alone(monkeypatch):
    config = pytest.importorskip("torch._inductor.config")
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    with config.patch(compile_threads=7):
        load_zygote().reread_import_time_settings()
        threads = config.compile_threads
    assert threads == 7
