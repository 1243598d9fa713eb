"""The course documents the material is built from, under their own titles, and what lecture 7 places where.

The labs, tutorials and the lab 5 grader cite the course's lectures; a title
that is not the course's (an invented "lecture on request lifecycles") sends
students looking for a lecture that does not exist. So the titles live here
once, and `tests/courseware/test_lecture_citations.py` checks every handout's
citations against them. The summaries are ours: what each document covers
that the labs lean on, not a copy of it.

Lecture 7 (推理系统架构) splits the engine into a control plane (it decides
what to do: accepting requests, keeping the queue, the scheduling policy,
recording metrics, governing resources) and a data plane (it does it:
tokenizer, prefill, decode, KV access, returning results). Its code walk
names `Scheduler.schedule` as where the control plane picks what runs next
and `ModelRunner.run` as where the data plane prepares inputs, block tables
and sampled outputs. `PLANES` maps the engine's functions onto that split,
for the ones the lecture settles; the others (the step loop that drives
both, the block manager's allocation, post-processing that both appends
tokens and frees blocks) are left to the report's argument and a TA.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Lecture:
    """One course document: how it is cited, its title as the course gives it, and what it covers."""

    key: str            # "L1", "L3", "L7", "note", "walkthrough"
    number: int | None  # the lecture number; None for the notes that are not numbered lectures
    title: str
    covers: str

    @property
    def citation(self) -> str:
        """How material cites it: 第 7 讲《推理系统架构》, or 笔记《推理服务架构》."""
        where = f"第 {self.number} 讲" if self.number is not None else {"note": "笔记", "walkthrough": "导读"}[self.key]
        return f"{where}《{self.title}》"


LECTURES: tuple[Lecture, ...] = (
    Lecture("L1", 1, "课程导论",
            "the frame every later lecture uses (request, state, control point, metric); TTFT and end-to-end "
            "latency as sums of stages; the minimal log; the engine's entry code"),
    Lecture("L3", 3, "一次推理请求的完整链路",
            "the six stages of one request (ingress, tokenizer, queue and schedule, prefill, decode, "
            "streaming return and reclamation); prefill against decode; the chat template; Sequence's fields"),
    Lecture("L7", 7, "推理系统架构",
            "control plane against data plane; request, state and observation paths; distributed topology; "
            "the call chain from the engine loop to the model runner; logs, metrics and traces as architecture"),
    Lecture("note", None, "推理服务架构",
            "static against continuous batching; prefill/decode disaggregation; chunked prefill; how vLLM, "
            "TensorRT-LLM and TGI are built"),
    Lecture("walkthrough", None, "推理全流程串讲（概览篇）",
            "why a serving engine at all; PagedAttention; one request's path through nano-vllm; prefill "
            "against decode; where the code starts"),
)

# A citation in material: 第 N 讲《title》, 笔记《title》 or 导读《title》.
CITATION = re.compile(r"(第\s*(\d+)\s*讲|笔记|导读)\s*《([^》]+)》")


def lecture(key: str) -> Lecture:
    for entry in LECTURES:
        if entry.key == key:
            return entry
    raise KeyError(f"no course document {key!r}; known: {', '.join(e.key for e in LECTURES)}")


def citation_problems(text: str) -> list[str]:
    """What is wrong with the lecture citations in `text`: unknown titles, wrong numbers, invented lectures.

    Besides the cited form, a title in quotes followed by 一讲 ("..." 一讲) is
    how the handouts used to name lectures the course does not have; any
    such phrase is reported, as is a bare 第 N 讲 for a lecture not listed here.
    """
    problems = []
    by_title = {entry.title: entry for entry in LECTURES}
    for match in CITATION.finditer(text):
        where, title = match.group(1), match.group(3)
        entry = by_title.get(title)
        if entry is None:
            problems.append(f"cites 《{title}》, which is not the title of a course document "
                            f"(known: {', '.join(e.citation for e in LECTURES)})")
        elif entry.citation.split("《")[0].replace(" ", "") != where.replace(" ", ""):
            problems.append(f"cites {match.group(0)}, but the course calls it {entry.citation}")
    for match in re.finditer(r"[\"“「]([^\"”」\n]{2,60})[\"”」]\s*一讲", text):
        problems.append(f"names a lecture \"{match.group(1)}\" 一讲, which the course does not have; "
                        "cite one of: " + ", ".join(e.citation for e in LECTURES))
    numbered = {entry.number for entry in LECTURES if entry.number is not None}
    for match in re.finditer(r"第\s*(\d+)\s*讲(?!\s*《)", text):
        if int(match.group(1)) not in numbered:
            problems.append(f"names {match.group(0)}, a lecture this course's material does not have")
    return problems


def cited(text: str) -> set[str]:
    """The keys of the course documents `text` cites in the cited form."""
    by_title = {entry.title: entry.key for entry in LECTURES}
    return {by_title[m.group(3)] for m in CITATION.finditer(text) if m.group(3) in by_title}


# --------------------------------------------------------------------------- lecture 7's control and data plane

CONTROL, DATA = "control", "data"
PLANE_WORDS = {CONTROL: ("control plane", "控制面", "控制平面"), DATA: ("data plane", "数据面", "数据平面")}

# (qualified-name pattern, plane, why, in lecture 7's terms). First match wins; a name no pattern matches is
# not settled by the lecture.
PLANES: tuple[tuple[str, str, str], ...] = (
    (r"Scheduler\.", CONTROL, "scheduling: the lecture's code walk watches Scheduler.schedule choose what runs"),
    (r"LifecycleLog\.|LLMEngine\._log_step$|LLMEngine\._record_", CONTROL, "recording metrics is control-plane work"),
    (r"LLMEngine\.(add_request|check_request|enqueue|abort_request)$", CONTROL,
     "accepting and queueing requests is control-plane work"),
    (r"LLMEngine\.tokenize$|Detokenizer\.", DATA, "the lecture puts the tokenizer on the data plane"),
    (r"ModelRunner\.", DATA, "the lecture's code walk watches ModelRunner.run prepare inputs, block tables and "
                             "sampled outputs: the data plane"),
    (r"(Qwen3\w*|RMSNorm|\w*Linear|\w*Embedding|\w*LMHead|\w*AttentionBackend|Attention|Sampler)\.", DATA,
     "token computation, prefill and decode, is the data plane"),
    (r"(store_kvcache|sample|greedy_tokens|rms_norm|apply_rope|silu_and_mul)$", DATA,
     "token computation and KV access are the data plane"),
)


def lecture_plane(qualname: str) -> tuple[str, str] | None:
    """(plane, why) that lecture 7 gives the function, or None where the lecture does not settle it."""
    for pattern, plane, why in PLANES:
        if re.match(pattern, qualname):
            return plane, why
    return None


def stated_planes(text: str) -> set[str]:
    """The planes a line of a report names (both, one, or none)."""
    lowered = text.lower()
    return {plane for plane, words in PLANE_WORDS.items() if any(word in lowered for word in words)}
