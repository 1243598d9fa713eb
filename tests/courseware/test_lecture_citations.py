"""Handouts cite the course's lectures by their real numbers and titles (courseware/lectures.py holds them).

Every lab handout cites at least one course document, in the form 第 N 讲《title》 (or 笔记《...》, 导读《...》),
and every citation names a document of the list with its own number; the invented "..." 一讲 form the
handouts once used is refused. Nothing tracked in the repository points at files outside it.
"""
from __future__ import annotations

import subprocess

import pytest

from courseware.lectures import LECTURES, citation_problems, cited, lecture
from labkit.labs import ROOT, all_labs

LABS = [lab for lab in all_labs()]


def test_the_list_names_each_document_once():
    assert len({e.key for e in LECTURES}) == len({e.title for e in LECTURES}) == len(LECTURES)
    numbers = [e.number for e in LECTURES if e.number is not None]
    assert sorted(numbers) == [1, 3, 7] and len(set(numbers)) == len(numbers)


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.lab_id)
def test_handout_cites_real_lectures_only(lab):
    text = (lab.folder / "README.md").read_text(encoding="utf-8")
    assert citation_problems(text) == []
    assert cited(text), f"{lab.lab_id}'s handout cites no course document (第 N 讲《...》)"


def test_the_check_catches_invented_and_misnumbered_lectures():
    # The sentence lab 1's handout carried before: a lecture title the course does not have.
    old = '本实验对应课程 "请求生命周期、可观测性与延迟指标" 一讲，以及 Tutorial **T02**'
    assert any("请求生命周期、可观测性与延迟指标" in p for p in citation_problems(old))
    assert citation_problems("第 7 讲《推理服务架构》")               # the note's title under a lecture number
    assert citation_problems("第 3 讲《推理系统架构》")               # lecture 7's title under number 3
    assert citation_problems("第 2 讲《调度》")                       # no such title
    assert citation_problems("见第 5 讲。")                           # a lecture the material does not have
    assert citation_problems(lecture("L7").citation) == []
    assert citation_problems(lecture("note").citation + "、" + lecture("walkthrough").citation) == []
    assert cited("第 1 讲《课程导论》和笔记《推理服务架构》") == {"L1", "note"}


def test_nothing_tracked_points_outside_the_repository():
    """Course material cites the lectures by title, never by a path to where the course's sources were kept."""
    outside = ["../" + "shared/", "shared/" + "seeds"]
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    hits = []
    for name in filter(None, files):
        path = ROOT / name.decode()
        if not path.is_file() or path.stat().st_size > 2 << 20:
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        hits += [f"{name.decode()}: {marker}" for marker in outside if marker in text]
    assert hits == []
