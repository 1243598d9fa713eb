# Tutorial 06 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: 推理系统架构

# %% [markdown]
# # Tutorial 06 · 推理系统架构：control plane、data plane 与可观测性
#
# **教学目标**
#
# 1. 把引擎的对象分成两类：**control plane**（决定做什么：`LLMEngine`、`Scheduler`、`BlockManager`、`Sequence`，全是 Python 元数据）
#    和 **data plane**（真正搬数据、做计算：tokenizer、`ModelRunner`、模型、attention、`kv_cache`、detokenizer），并量出两边各占多少内存和时间。
# 2. 从一次真实运行里 **追踪** 出调用链 `LLM.generate → LLMEngine.step → Scheduler.schedule → ModelRunner.run`（用 `sys.setprofile`，不靠读代码）。
# 3. 可观测性的三件套：**log**（发生了什么）、**metrics**（多快、多少）、**trace**（时间花在哪里），都建立在引擎的 lifecycle log 和方法包装之上。
# 4. 把架构图画成请求、状态、观测三条路径，认出第 7 讲的三种坏图。
# 5. 第 7 讲的控制面问题：准入与限流、配额、优先级、路由，在引擎前面加一个最小的 gateway 实测每一个。
# 6. 架构笔记的 vLLM / TensorRT-LLM / TGI 对比：它们的主循环和本引擎的对应关系，以及怎样选（笔记的 Q5）。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 100 分钟，对应第 7 讲和架构笔记的框架对比
#
# 下表每个数字都有格子里的断言（括号里是断言的界）；只说 "随机器变" 的数字没有断言，不要拿它们和学生对答案。
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 两个平面 | 10 | 表格，无数字。强调 tokenizer 按讲义放在数据面（按职责分，不按进程分） |
# | 2. 调用链 | 10 | 四条调用链都在（断言） |
# | 3. 时间花在哪个平面 | 10 | `Scheduler.schedule` 每步几十微秒，不到 model forward 的 1/10（断言）；CPU 上 model forward 占 step 一半以上（断言）；具体微秒数随机器变 |
# | 4. log / metrics / trace | 10 | 在线 p50 = 离线 p50（断言） |
# | 5. 三条路径 + 坏图 | 15 | 调用关系是确定的（断言）；文本长 100 倍，tokenize 慢 10 倍以上（断言）；三种坏图各被认出、三路径图没有毛病（断言，确定） |
# | 6. 控制面的四个问题 | 15 | 全部以 tick 计，确定：优先级让 chat 的 TTFT 变短、配额让 B 的 TTFT 变短、限流拒绝一部分并缩短被接受者的最长 TTFT、least_loaded 的完成时刻早于 round_robin（断言） |
# | 7. 框架对比 | 10 | `LLMEngine.step` 的三步顺序（断言）；对比表的星是笔记的评价，不是测量 |
# | 课堂练习 + 第 7 讲练习 | 20 | 练习 1 的打印会说两组是否可分（不要从一次运行的 1–3 个百分点下结论）；练习 3：burst 8 拒绝更少、最长 TTFT 更长（断言，确定）；练习 4：batch 16 的吞吐 > 3 × batch 1，TPOT 反之（断言） |
#
# 练习一的五个角色让学生先在代码里找，再运行答案格子看调用次数。

# %%
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib.pyplot as plt
import numpy as np
import torch

from courseware.tiny_model import ensure_tiny_model
from reference import LLM, SamplingParams
from reference.metrics import request_metrics, summarize

MODEL = os.environ.get("INFERLAB_MODEL") or str(ensure_tiny_model())
if not torch.cuda.is_available():
    torch.set_num_threads(1)  # tiny model：单线程更快

# %% [markdown]
# ## 1. 两个平面
#
# 第 7 讲："控制面决定做什么，数据面决定怎么做"；控制面 "接收请求、维护队列、决定调度策略、记录指标和做资源治理"，
# 数据面 "真正执行 tokenizer、prefill、decode、KV 访问和结果回传"。放到本引擎的对象上：
#
# | | control plane | data plane |
# | --- | --- | --- |
# | 对象 | `LLM` / `LLMEngine` 的主循环、`Scheduler`、`BlockManager`、`Sequence`、`LifecycleLog` | tokenizer、`ModelRunner`、`Qwen3ForCausalLM`、attention backend、sampler、detokenizer |
# | 数据 | Python 列表和字典：队列、block table、hash 表、计数 | 请求的内容：文本、token ids，以及张量（权重、`kv_cache`、每一步的 `input_ids` / `slot_mapping` ...） |
# | 每一步做什么 | 选 batch、分配 block、记事件、判断停止 | 文本 ↔ token、准备输入张量、前向、采样 |
# | 在哪里跑 | 永远在 CPU 上 | 张量部分有 GPU 时在 GPU 上；tokenizer、detokenizer 在 CPU 上 |
#
# 控制面和执行热路径之间的接口是 `ModelRunner.run(seqs, is_prefill)`：control plane 交出一组 `Sequence`，拿回每个序列的新 token。
# tokenizer 和 detokenizer 在这个接口的两头（请求进来时、token 回传时），和控制面在同一个进程里、都在 CPU 上，
# 但它们处理的是请求的数据本身、不做任何决定，所以按讲义放在数据面：平面是按 **职责** 分的，不是按设备或进程分的（第 5 节量一量）。

# %%
llm = LLM(MODEL, device="auto", max_num_seqs=4)
runner = llm.model_runner
weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
print(f"data plane    : weights {weights / 2**20:8.2f} MiB, kv_cache {runner.kv_cache.nbytes / 2**20:8.2f} MiB "
      f"on {runner.kv_cache.device}")
bm = llm.block_manager
print(f"control plane : {len(bm.blocks)} Block objects (ids, ref counts, hashes), "
      f"{len(llm.scheduler.waiting)} waiting / {len(llm.scheduler.running)} running sequences; no tensors")

# %% [markdown]
# ## 2. 从真实运行里追踪调用链
#
# `sys.setprofile` 让 Python 在每次函数调用和返回时通知我们。只记下 `reference/` 包里的函数，就得到引擎自己的调用树。
# 跑一个请求、生成 2 个 token（1 次 prefill + 1 次 decode）。

# %%
# The engine package: reference/ (student_exercises/ in a release, where LLM itself comes from courseware.engine).
REF_DIR = os.path.dirname(sys.modules[SamplingParams.__module__.split(".")[0]].__file__)


def trace_calls(fn):
    """Run fn() and return [(depth, qualified name)] for every call into the reference package."""
    calls, stack = [], []

    def profiler(frame, event, arg):
        if event == "call":
            code = frame.f_code
            name = getattr(code, "co_qualname", code.co_name)
            if code.co_filename.startswith(REF_DIR) and not name.split(".")[-1].startswith("<"):
                calls.append((len(stack), name))
                stack.append(frame)
        elif event == "return" and stack and stack[-1] is frame:
            stack.pop()

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def print_tree(calls, max_depth=3):
    """Print the call tree, folding repeated sibling calls into 'x N'."""
    folded = []
    for depth, name in calls:
        if depth > max_depth:
            continue
        if folded and tuple(folded[-1][:2]) == (depth, name):
            folded[-1][2] += 1
        else:
            folded.append([depth, name, 1])
    for depth, name, n in folded:
        print("    " * depth + name + (f"  x{n}" if n > 1 else ""))


calls = trace_calls(lambda: llm.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False))
print_tree(calls, max_depth=2)

# %% [markdown]
# 和第 7 讲的调用链草图对照：讲义写 `LLM.generate -> LLMEngine.generate`、`LLMEngine.step -> ModelRunner.execute_model`（vLLM 的名字）。
# 本引擎里 `LLM` 是 `LLMEngine` 的子类，`LLM.generate` 就是引擎自己的驱动循环；执行器的入口叫 `ModelRunner.run`
# （和 nano-vllm 一样，讲义的 "源码穿插" 页也用这个名字）。下面核对的是本引擎真实的链：

# %%
def has_chain(calls, chain):
    """Is there a path chain[0] -> chain[1] -> ... where each is a direct child of the previous one?"""
    for i, (depth, name) in enumerate(calls):
        if name != chain[0]:
            continue
        level, rest = depth, list(chain[1:])
        for d, n in calls[i + 1:]:
            if d <= depth:
                break
            if rest and d == level + 1 and n == rest[0]:
                rest.pop(0)
                level += 1
        if not rest:
            return True
    return False


for chain in (["LLM.generate", "LLMEngine.step", "Scheduler.schedule"],
              ["LLM.generate", "LLMEngine.step", "ModelRunner.run", "ModelRunner.prepare_prefill"],
              ["LLM.generate", "LLMEngine.step", "ModelRunner.run", "ModelRunner.prepare_decode"],
              ["LLM.generate", "LLMEngine.step", "LLMEngine.postprocess", "Scheduler.mark_computed",
               "BlockManager.mark_computed"]):
    print(" -> ".join(chain), ":", has_chain(calls, chain))
    assert has_chain(calls, chain)

# %% [markdown]
# 往下多看几层：`ModelRunner.run` 里面是 data plane —— 准备输入、模型的各层、attention backend、采样。
# 先看 prefill 那一步（第一个 `ModelRunner.run`）。为了好读，这里隐去了 `Sequence` 的小属性和 `LifecycleLog.now`。

# %%
def subtree(calls, name, nth=0):
    """The calls made inside the nth call of `name`, with depths relative to it."""
    start = [i for i, (_, n) in enumerate(calls) if n == name][nth]
    base = calls[start][0]
    out = [(0, name)]
    for depth, n in calls[start + 1:]:
        if depth <= base:
            break
        out.append((depth - base, n))
    return out


def readable(tree):
    return [c for c in tree if not c[1].startswith(("Sequence.", "LifecycleLog.now"))]


prefill_run = subtree(calls, "ModelRunner.run", nth=0)
print_tree(readable(prefill_run), max_depth=5)
assert any(n.endswith("Backend.forward") for _, n in prefill_run)   # the attention backend, called from Python

# %% [markdown]
# 再看 decode 那一步（第二个 `ModelRunner.run`）。在 CPU 上它和 prefill 一样，一层层调用模型。
# 在 GPU 上（CUDA graphs 打开时），这里只剩一次 graph replay：整个 decode 前向是事先录好的一串 kernel，
# 在 GPU 上重放，Python 根本看不到模型的各层 —— 这正是 CUDA graphs 省掉的开销（Tutorial 07）。

# %%
decode_run = subtree(calls, "ModelRunner.run", nth=1)
print_tree(readable(decode_run), max_depth=3)
layers_called = any(n == "Qwen3DecoderLayer.forward" for _, n in decode_run)
print("decode step ran the model layers from Python:", layers_called)
if not torch.cuda.is_available():
    assert layers_called

# %% [markdown]
# ## 3. 时间花在哪个平面？
#
# 包装（wrap）几个方法，记下每次调用的开始和结束时间。这些 "span" 之后还会变成 trace 文件。

# %%
class Tracer:
    """Collects spans (name, start, end, depth); `annotate` is the context manager, `wrap` instruments a method."""

    def __init__(self):
        self.spans = []
        self._depth = 0

    @contextmanager
    def annotate(self, name, **args):
        start = time.perf_counter()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.spans.append({"name": name, "start": start, "end": time.perf_counter(), "depth": self._depth, **args})

    def wrap(self, obj, attr, name=None):
        original = getattr(obj, attr)

        def wrapper(*args, **kwargs):
            with self.annotate(name or attr):
                return original(*args, **kwargs)

        setattr(obj, attr, wrapper)


def instrument(llm, tracer):
    tracer.wrap(llm, "step", "LLMEngine.step")
    tracer.wrap(llm.scheduler, "schedule", "Scheduler.schedule")
    tracer.wrap(llm, "postprocess", "LLMEngine.postprocess")
    tracer.wrap(llm.model_runner, "run", "ModelRunner.run")
    tracer.wrap(llm.model_runner, "prepare_prefill", "prepare inputs")
    tracer.wrap(llm.model_runner, "prepare_decode", "prepare inputs")
    tracer.wrap(llm.model_runner.model, "forward", "model forward")
    if hasattr(llm.model_runner, "_replay_decode_graph"):   # GPU: decode replays a CUDA graph instead
        tracer.wrap(llm.model_runner, "_replay_decode_graph", "model forward")


def workload(llm, n=12):
    vocab = llm.config.hf_config["vocab_size"]
    prompts = [[(7 * i + j) % (vocab - 3) for j in range(16 + 8 * (i % 4))] for i in range(n)]
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 8 * (i % 3), ignore_eos=True) for i in range(n)]
    return prompts, params


llm = LLM(MODEL, device="auto", max_num_seqs=4)
llm.generate(*workload(llm, 2), use_tqdm=False)   # warm-up
tracer = Tracer()
instrument(llm, tracer)
llm.generate(*workload(llm), use_tqdm=False)

total = defaultdict(float)
for s in tracer.spans:
    total[s["name"]] += s["end"] - s["start"]
run = total["ModelRunner.run"]
parts = {
    "schedule (control)": total["Scheduler.schedule"],
    "postprocess (control)": total["LLMEngine.postprocess"],
    "other step overhead (control)": total["LLMEngine.step"] - total["Scheduler.schedule"] - total["LLMEngine.postprocess"] - run,
    "prepare inputs (data)": total["prepare inputs"],
    "model forward (data)": total["model forward"],
    "sampling etc. (data)": run - total["prepare inputs"] - total["model forward"],
}
steps = sum(1 for s in tracer.spans if s["name"] == "LLMEngine.step")
for name, sec in parts.items():
    print(f"{name:32} {sec * 1e3:8.2f} ms  {sec / total['LLMEngine.step']:6.1%}   ({sec / steps * 1e6:7.1f} us/step)")
assert abs(sum(parts.values()) - total["LLMEngine.step"]) < 1e-6
schedule_us = parts["schedule (control)"] / steps * 1e6
forward_share = parts["model forward (data)"] / total["LLMEngine.step"]
print(f"Scheduler.schedule {schedule_us:.0f} us/step; model forward {forward_share:.0%} of the step time")
# Per-step medians: a pause of a busy machine lands in whichever span it hits, and a sum over ~60 steps keeps it.
schedule_median = statistics.median(s["end"] - s["start"] for s in tracer.spans if s["name"] == "Scheduler.schedule")
forward_median = statistics.median(s["end"] - s["start"] for s in tracer.spans if s["name"] == "model forward")
print(f"per-step medians: Scheduler.schedule {schedule_median * 1e6:.0f} us, model forward {forward_median * 1e6:.0f} us")
assert schedule_median < 0.1 * forward_median, "the control plane is a small part of a step"
if llm.config.device == "cpu":
    assert forward_share > 0.5, "on the CPU the forward's operator overheads take most of the step"

# %%
fig, ax = plt.subplots(figsize=(7, 2.8))
left = 0.0
colors = ["#98df8a", "#2ca02c", "#c7e9c0", "#aec7e8", "#1f77b4", "#6baed6"]
for (name, sec), color in zip(parts.items(), colors):
    share = sec / total["LLMEngine.step"] * 100
    ax.barh(0, share, left=left, color=color, label=f"{name} {share:.0f}%")
    left += share
ax.set(xlim=(0, 100), yticks=[], xlabel=f"% of LLMEngine.step time ({llm.config.device})")
fig.legend(ncols=2, fontsize=8, loc="lower center")
plt.tight_layout(rect=(0, 0.3, 1, 1))
plt.show()

# %% [markdown]
# 怎么读这张图（比例取决于你的机器）：
#
# - control plane（绿色）每步只有几十微秒（打印的 `Scheduler.schedule` 每步微秒数；断言：每步的中位数不到 model forward 每步中位数的十分之一。用中位数，是因为机器忙时的一次停顿落在哪个 span 里，总和就带上它）：
#   选 batch、分配 block、记事件，都是 Python 对少量对象的操作，和模型大小无关。
# - 在 CPU 上，即使是 tiny model，model forward 也占大头（断言：一半以上）：每个 PyTorch 算子在 CPU 上都有微秒级的固定开销，2 层的模型一步就有上百个算子。
# - 在 GPU 上，真正的计算可能比一次 kernel launch 还快，CPU 这边（Python、launch、control plane）反而成了瓶颈 ——
#   CUDA graphs、把调度和计算重叠起来的异步调度，都是为了把这部分藏起来（Tutorial 07）。

# %% [markdown]
# ## 4. 可观测性：log、metrics、trace
#
# 三者回答不同的问题：
#
# - **log**：发生了什么？（某个请求在第几步被调度、被抢占、结束）—— 逐条事件，便于 grep 和回放。
# - **metrics**：有多快、有多少？（TTFT、TPOT 的分布，batch size）—— 聚合后的数字，便于告警和对比。
# - **trace**：时间花在哪里？（一步里 schedule、forward 各用多久）—— 带起止时间的 span，便于在时间轴上看。
#
# 三者都从同一个源头来：引擎的 lifecycle log（每个状态变化都 `emit` 一条事件）加上上面的方法包装。
# 下面用 `llm.log.subscribe` 订阅每一条事件，事件一来就同时写日志、更新 metrics。

# %%
class Metrics:
    """A tiny metrics registry: observe(name, value) keeps every sample; summary gives p50/p99."""

    def __init__(self):
        self.samples = defaultdict(list)

    def observe(self, name, value):
        self.samples[name].append(value)

    def summary(self, name):
        values = np.asarray(self.samples[name])
        return {"count": len(values), "p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


stream = []
logger = logging.getLogger("inferlab.tutorial06")
logger.setLevel(logging.INFO)
logger.propagate = False
handler = logging.Handler()
handler.emit = lambda record: stream.append(record.getMessage())
logger.handlers = [handler]
metrics = Metrics()


def observe(llm):
    arrival, first_token = {}, {}

    def on_event(e):
        event, seq_id, step = e["event"], e["seq_id"], e["step"]
        if event == "ARRIVED":
            arrival[seq_id] = e["time"]
        elif event == "STEP":
            stage = "prefill" if e["is_prefill"] else "decode"
            logger.info("stage=%s step=%d batch_size=%d waiting=%d", stage, step, e["batch_size"], e["num_waiting"])
            metrics.observe("batch_size", e["batch_size"])
        elif event == "SCHEDULED":
            logger.info("stage=%s request_id=%d tokens=%d", "prefill" if e["is_prefill"] else "decode", seq_id,
                        e["num_new_tokens"])
        elif event == "FIRST_TOKEN":
            first_token[seq_id] = e["time"]
            metrics.observe("ttft_ms", (e["time"] - arrival[seq_id]) * 1e3)
        elif event == "FINISHED" and e["num_output_tokens"] > 1:
            metrics.observe("tpot_ms", (e["time"] - first_token[seq_id]) / (e["num_output_tokens"] - 1) * 1e3)
            logger.info("stage=finished request_id=%d reason=%s", seq_id, e["reason"])

    llm.log.subscribe(on_event)   # the scheduler shares this log object, so its events come too


llm = LLM(MODEL, device="auto", max_num_seqs=4)
tracer = Tracer()
instrument(llm, tracer)
observe(llm)
llm.generate(*workload(llm), use_tqdm=False)

print("\n".join(stream[:8]), "\n...")
for name in ("ttft_ms", "tpot_ms", "batch_size"):
    print(name, metrics.summary(name))

# %% [markdown]
# 这些 metrics 必须和 `reference.metrics`（只读 lifecycle log 的离线计算）完全一致 —— 同一份事件，同一个定义：

# %%
offline = summarize(request_metrics(llm.log.events).values())
for name, key in (("ttft_ms", "ttft"), ("tpot_ms", "tpot")):
    online = metrics.summary(name)
    print(f"{name}: online p50 {online['p50']:.3f} ms, offline p50 {offline[key]['p50'] * 1e3:.3f} ms")
    assert abs(online["p50"] - offline[key]["p50"] * 1e3) < 1e-6 and online["count"] == offline[key]["count"]

# %% [markdown]
# ### Trace：写成 Chrome trace 文件
#
# 把 span 写成 [Trace Event Format](https://ui.perfetto.dev)（`"ph": "X"` 的完整事件），
# 用 Perfetto（ui.perfetto.dev）或 `chrome://tracing` 打开就能在时间轴上缩放查看。这里也直接画出前几步。

# %%
t_origin = min(s["start"] for s in tracer.spans)
trace_events = [{"name": s["name"], "ph": "X", "pid": 0, "tid": 0, "ts": (s["start"] - t_origin) * 1e6,
                 "dur": (s["end"] - s["start"]) * 1e6} for s in tracer.spans]
trace_path = os.path.join(tempfile.mkdtemp(prefix="inferlab-trace-"), "tutorial06.trace.json")
with open(trace_path, "w") as f:
    json.dump({"traceEvents": trace_events}, f)
print(f"{len(trace_events)} spans written to {trace_path}")

step_spans = [s for s in tracer.spans if s["name"] == "LLMEngine.step"][:4]
window = (step_spans[0]["start"], step_spans[-1]["end"])
fig, ax = plt.subplots(figsize=(7, 3.4))
palette = {"LLMEngine.step": "#dddddd", "Scheduler.schedule": "#2ca02c", "ModelRunner.run": "#aec7e8",
           "prepare inputs": "#6baed6", "model forward": "#1f77b4", "LLMEngine.postprocess": "#98df8a"}
for s in tracer.spans:
    if window[0] <= s["start"] and s["end"] <= window[1]:
        ax.barh(-s["depth"], (s["end"] - s["start"]) * 1e3, left=(s["start"] - window[0]) * 1e3,
                color=palette[s["name"]], edgecolor="white")
ax.set(xlabel="ms", yticks=[0, -1, -2], yticklabels=["step", "schedule / run /\npostprocess", "prepare /\nforward"],
       title="trace of the first 4 steps")
fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()], labels=list(palette),
           fontsize=8, ncols=3, loc="lower center")
plt.tight_layout(rect=(0, 0.17, 1, 1))
plt.show()

# %% [markdown]
# ## 5. 三条路径：请求、状态、观测（从第 2 节的调用树生成）
#
# 第 7 讲要求架构图同时画出 **请求路径**、**状态路径** 和 **观测路径**。不用手画：第 2 节的 `calls` 记下了一次 `generate`
# 里每个调用和它的深度，由此能还原 "谁调用了谁"。下面按第一次被调用的顺序把三条路径画出来，
# 并核对讲义的两个摆放：tokenizer 在请求路径上、调度之前；KV 的分配和回收由调度器（control plane）发起，不在 `ModelRunner` 里。

# %%
def call_edges(calls):
    """{(caller, callee)} and {name: index of its first call}, from the (depth, name) list."""
    stack, edges, first = [], set(), {}
    for i, (depth, name) in enumerate(calls):
        del stack[depth:]
        if stack:
            edges.add((stack[-1], name))
        stack.append(name)
        first.setdefault(name, i)
    return edges, first


def ancestors(name, edges):
    """Every function on some call path above `name`."""
    found, todo = set(), [name]
    while todo:
        current = todo.pop()
        for caller, callee in edges:
            if callee == current and caller not in found:
                found.add(caller)
                todo.append(caller)
    return found


edges, first = call_edges(calls)
PATHS = {
    "request path": ["LLM.generate", "LLMEngine.tokenize", "LLMEngine.enqueue", "LLMEngine.step",
                     "Scheduler.schedule", "ModelRunner.run", "LLMEngine.postprocess"],
    "state path": ["Scheduler.add", "BlockManager.can_allocate", "BlockManager.allocate", "Scheduler.finish",
                   "BlockManager.deallocate"],
    "observation path": sorted({a for a, b in edges if b == "LifecycleLog.emit"}, key=first.get),
}


def draw_paths(paths, title):
    """One column per path, its functions top to bottom in first-call order, arrows between their boxes."""
    fig, ax = plt.subplots(figsize=(7, 0.55 * max(len(v) for v in paths.values()) + 0.9))
    ax.set(xlim=(0, 3), ylim=(0, 1))
    ax.axis("off")
    colors = ["#fde0dd", "#deebf7", "#e5f5e0"]
    for col, (path, names) in enumerate(paths.items()):
        ax.text(col + 0.5, 0.98, path, ha="center", va="top", fontsize=9, fontweight="bold", transform=ax.transData)
        boxes = []
        for row, name in enumerate(sorted(names, key=first.get)):
            y = 0.86 - row * (0.8 / max(len(v) for v in paths.values()))
            boxes.append(ax.text(col + 0.5, y, name, ha="center", va="center", fontsize=8,
                                 bbox=dict(boxstyle="round,pad=0.3", fc=colors[col % 3])))
        for upper, lower in zip(boxes, boxes[1:]):       # arrows end at the box edges, not under the boxes
            ax.annotate("", xy=(0.5, 1.0), xycoords=lower, xytext=(0.5, 0.0), textcoords=upper,
                        arrowprops=dict(arrowstyle="-|>", color="#444444", shrinkA=1, shrinkB=1))
    ax.set_title(title, fontsize=9)
    plt.tight_layout()
    plt.show()


draw_paths(PATHS, "three paths of one generate(), in first-call order (from sys.setprofile)")
for path, names in PATHS.items():
    print(f"{path:17}", " -> ".join(sorted(names, key=first.get)))

# 讲义的摆放，用调用关系核对
assert ("LLM._submit", "LLMEngine.tokenize") in edges and first["LLMEngine.tokenize"] < first["Scheduler.schedule"]
assert "Scheduler.schedule" in ancestors("BlockManager.allocate", edges)
assert "ModelRunner.run" not in ancestors("BlockManager.allocate", edges) | ancestors("BlockManager.deallocate", edges)
emitters = {a.split(".")[0] for a in PATHS["observation path"]}
assert {"LLMEngine", "Scheduler"} <= emitters, emitters

# %% [markdown]
# 和讲义对一对（上一格的断言保证）：
#
# - **tokenizer** 在请求路径的最前面（`LLM._submit → LLMEngine.tokenize`），早于第一次 `Scheduler.schedule`。
#   它属于 **数据面**（第 7 讲的原话，本教程跟随讲义）：它把请求的内容从文本变成 token，工作量随内容的长度增长，
#   不做任何决定。本引擎里它和控制面在同一个 CPU 进程里、在调度之前同步运行；真实服务里常常放在 API server 进程里，
#   和 GPU 上的数据面分开扩容。下一格量一量 "工作量随数据增长"：文本长 100 倍，tokenize 的时间至少长 10 倍。
# - **KV 分配 / 回收** 由 `Scheduler`（`_schedule_prefill → BlockManager.allocate`，`finish → BlockManager.deallocate`）发起：
#   决定 "给谁 block" 的是控制面；`ModelRunner` 只按 block table 读写 `kv_cache`（数据面）。
# - **观测点** 分布在引擎和调度器两处（`LifecycleLog.emit` 的调用者）：请求进入、调度决定、token 产出、结束各记一条 —— 观测路径贯穿两个平面，
#   这就是讲义说日志 "属于架构" 的原因。

# %%
def fastest(fn, repeats=5):
    """Shortest of a few runs: another process on the machine only ever makes a run slower."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


probe = LLM(MODEL, device="auto", max_num_seqs=4)
sentence = "什么是 KV cache？prefill 和 decode 有什么不同。"
short_text, long_text = sentence * 2, sentence * 200
t_short, t_long = fastest(lambda: probe.tokenize(short_text)), fastest(lambda: probe.tokenize(long_text))
n_short, n_long = len(probe.tokenize(short_text)), len(probe.tokenize(long_text))
print(f"tokenize: {n_short} tokens {t_short * 1e6:.0f} us, {n_long} tokens {t_long * 1e6:.0f} us "
      f"({t_long / t_short:.0f}x for {n_long / n_short:.0f}x the text)")
assert t_long > 10 * t_short, "the tokenizer's work grows with the data: a data-plane stage"

# %% [markdown]
# ### 5.1 坏架构图坏在哪里（第 7 讲的三个例子）
#
# 讲义列了学生最常画的三种坏图：
#
# - **坏图一**：只列模块名，不说明调用方向和控制点；
# - **坏图二**：只画数据流，不画状态驻留和资源回收；
# - **坏图三**：把日志、benchmark、回归系统完全排除在架构之外，导致系统边界被画得过窄。
#
# 把 "一张图" 写成数据（有哪些框、哪些箭头、哪条路径），三种毛病就都能检查。下面从上面的真实调用关系里各删掉一部分，
# 造出讲义的三种坏图，再让同一个检查函数说出每张图缺了什么；完整的三路径图应当一条毛病也没有。

# %%
CONTROL_POINT = "Scheduler.schedule"                      # 第 7 讲：调度器是控制面选择执行对象的地方
STATE_CALLS = {"BlockManager.allocate", "BlockManager.deallocate"}   # 状态驻留（分配）与资源回收


def diagram_faults(boxes, arrows, paths):
    """The lecture's bad-diagram faults found in a diagram given as boxes, arrows (caller, callee) and named paths."""
    faults = []
    if not arrows or CONTROL_POINT not in boxes:
        faults.append("坏图一：只列模块名，没有调用方向和控制点")
    if not STATE_CALLS <= {name for names in paths.values() for name in names}:
        faults.append("坏图二：只画数据流，没有状态驻留和资源回收")
    if "observation path" not in paths:
        faults.append("坏图三：日志、benchmark 和回归不在图里，系统边界画窄了")
    return faults


def as_diagram(paths, with_arrows=True):
    boxes = {name for names in paths.values() for name in names}
    arrows = {(a, b) for names in paths.values() for a, b in zip(names, names[1:])} if with_arrows else set()
    return boxes, arrows, paths


good = as_diagram(PATHS)
bad = {"坏图一": as_diagram({"modules": sorted({n.split(".")[0] for n in good[0]})}, with_arrows=False),
       "坏图二": as_diagram({"request path": PATHS["request path"]}),
       "坏图三": as_diagram({k: v for k, v in PATHS.items() if k != "observation path"})}
print("三路径图:", diagram_faults(*good) or "没有毛病")
expected = {"坏图一": ["坏图一", "坏图二", "坏图三"], "坏图二": ["坏图二", "坏图三"], "坏图三": ["坏图三"]}
for name, diagram in bad.items():
    print(f"{name}: {diagram_faults(*diagram)}")
    assert [f.split("：")[0] for f in diagram_faults(*diagram)] == expected[name]
assert diagram_faults(*good) == []

# %% [markdown]
# 坏图一只有模块名（`LLMEngine`、`Scheduler`……），一个箭头都没有，看不出谁调用谁、谁做决定；坏图二只有请求沿着
# `generate → step → run` 走的那条线，block 在哪里分配、在哪里回收都不在图上；坏图三有请求和状态，
# 但没有观测路径，图上看不出系统靠什么证明自己按预期工作。毛病会叠加：坏图一同时也缺状态和观测，坏图二也缺观测，
# 检查函数把它们都列出来了（断言）。
# 讲义推荐的 "三层图"（入口与控制、执行与状态、观测与验证）就是上面第 5 节的三列。

# %% [markdown]
# ## 6. 控制面的典型问题：准入与限流、配额、优先级、路由
#
# 第 7 讲："控制面的核心是资源治理和服务目标兑现"：什么时候接收新请求；怎样分配配额和优先级；什么时候扩容、限流或改变路由。
# 本引擎的控制面只管一件事：一个实例里哪些请求进 batch（`max_num_seqs`、token 预算、KV block）。
# 其余几个问题在真实服务里由引擎 **前面** 的一层回答（API gateway、router，例如 vLLM 的 router、TGI 的 router），
# 它们只看元数据（租户、优先级、排队长度、未完成的 token 数），从不碰张量。
#
# 下面写一个最小的 gateway，放在一个或两个引擎实例前面。时间用 "tick" 计：每个 tick 每个有活的实例 `step()` 一次，
# 所以每次运行的结果是确定的（不受机器快慢影响）：
#
# - **限流**（rate limit）：token bucket，每个 tick 补 `rate` 个令牌、最多存 `burst` 个；没有令牌的请求立即被拒绝（HTTP 429）；
# - **配额**（quota）：每个租户同时在引擎里的请求数上限；
# - **优先级**（priority）：gateway 手里的请求按优先级、再按到达先后交给引擎；
# - **路由**（routing）：两个实例时，`round_robin` 轮流发，`least_loaded` 发给未完成 token 最少的那个。
#
# gateway 只在引擎有空位时才把请求交进去（`max_num_seqs`），所以排队发生在 gateway 里，它的策略才起作用。

# %%
from dataclasses import dataclass, field


@dataclass
class Request:
    rid: int
    tenant: str
    arrival: int                       # tick
    prompt: list
    max_tokens: int
    priority: int = 0
    replica: int | None = None
    seq_id: int | None = None
    first_token: int | None = None     # tick
    finished: int | None = None        # tick
    rejected: bool = False


@dataclass
class Gateway:
    """A control plane in front of engine replicas: rate limit, per-tenant quota, priority order, routing."""
    replicas: list
    rate: float | None = None          # tokens added to the bucket per tick (None: no rate limit)
    burst: int = 0
    quota: int | None = None           # requests per tenant inside the engines at once
    use_priority: bool = False
    route: str = "round_robin"         # or "least_loaded"
    queue: list = field(default_factory=list)
    bucket: float = 0.0
    _next: int = 0

    def admit(self, req: Request) -> None:
        """Rate limit at the door: no token, no entry (the client gets a 429 at once instead of waiting)."""
        if self.rate is not None:
            if self.bucket < 1:
                req.rejected = True
                return
            self.bucket -= 1
        self.queue.append(req)

    def outstanding(self, replica: int, live: list) -> int:
        return sum(r.max_tokens for r in live if r.replica == replica and r.finished is None)

    def dispatch(self, live: list) -> None:
        """Hand queued requests to replicas with a free seat, in priority order, within each tenant's quota."""
        order = sorted(self.queue, key=lambda r: (-r.priority if self.use_priority else 0, r.arrival, r.rid))
        for req in order:
            inside = sum(1 for r in live if r.tenant == req.tenant and r.replica is not None and r.finished is None)
            if self.quota is not None and inside >= self.quota:
                continue
            free = [i for i, e in enumerate(self.replicas) if e.num_running + e.num_waiting < e.config.max_num_seqs]
            if not free:
                break
            if self.route == "least_loaded":
                target = min(free, key=lambda i: (self.outstanding(i, live), i))
            else:
                target = self._next % len(self.replicas)
                if target not in free:
                    continue
                self._next += 1
            req.replica = target
            req.seq_id = self.replicas[target].add_request(req.prompt, SamplingParams(
                temperature=0.0, max_tokens=req.max_tokens, ignore_eos=True))
            self.queue.remove(req)

    def run(self, requests: list) -> list:
        pending = sorted(requests, key=lambda r: (r.arrival, r.rid))
        live, tick = [], 0
        if self.rate is not None:
            self.bucket = self.burst
        while pending or self.queue or any(r.replica is not None and r.finished is None for r in live):
            if self.rate is not None:
                self.bucket = min(self.burst, self.bucket + (self.rate if tick else 0))
            while pending and pending[0].arrival <= tick:
                req = pending.pop(0)
                live.append(req)
                self.admit(req)
            self.dispatch(live)
            for index, engine in enumerate(self.replicas):
                if engine.is_finished():
                    continue
                for out in engine.step():
                    req = next(r for r in live if r.replica == index and r.seq_id == out.seq_id)
                    if out.new_token_ids and req.first_token is None:
                        req.first_token = tick
                    if out.finished:
                        req.finished = tick
            tick += 1
        return requests


def replicas(n, max_num_seqs=2):
    return [LLM(MODEL, device="auto", max_num_seqs=max_num_seqs, enable_prefix_caching=False) for _ in range(n)]


def ttft(reqs, **match):
    """TTFT in ticks of the requests whose fields equal `match`, worst first."""
    chosen = [r for r in reqs if all(getattr(r, k) == v for k, v in match.items()) and not r.rejected]
    return max(r.first_token - r.arrival for r in chosen)


vocab = llm.config.hf_config["vocab_size"]
prompt = lambda i, n=24: [(11 * i + j) % (vocab - 3) for j in range(n)]

# 优先级：6 个 batch 任务先到，2 个交互请求随后；一个实例，最多 2 个同时跑
def priority_case():
    return [Request(i, "batch", 0, prompt(i), 16) for i in range(6)] + \
           [Request(6 + i, "chat", 1, prompt(6 + i), 16, priority=1) for i in range(2)]

fifo = Gateway(replicas(1)).run(priority_case())
prio = Gateway(replicas(1), use_priority=True).run(priority_case())
print(f"priority: chat TTFT {ttft(fifo, tenant='chat')} ticks first-come-first-served, "
      f"{ttft(prio, tenant='chat')} ticks with priority; batch worst {ttft(fifo, tenant='batch')} -> {ttft(prio, tenant='batch')}")
assert ttft(prio, tenant="chat") < ttft(fifo, tenant="chat") and ttft(prio, tenant="batch") >= ttft(fifo, tenant="batch")

# 配额：租户 A 一次来 6 个长请求，B 稍后来 2 个
def quota_case():
    return [Request(i, "A", 0, prompt(i), 24) for i in range(6)] + [Request(6 + i, "B", 2, prompt(6 + i), 8) for i in range(2)]

no_quota = Gateway(replicas(1)).run(quota_case())
with_quota = Gateway(replicas(1), quota=1).run(quota_case())
print(f"quota: tenant B TTFT {ttft(no_quota, tenant='B')} ticks without a quota, {ttft(with_quota, tenant='B')} with 1 per tenant")
assert ttft(with_quota, tenant="B") < ttft(no_quota, tenant="B")

# 限流：12 个请求在前 3 个 tick 里涌进来；桶里最多 4 个令牌，每 8 个 tick 补 1 个
def burst_case():
    return [Request(i, "A", i // 4, prompt(i), 16) for i in range(12)]

open_door = Gateway(replicas(1)).run(burst_case())
limited = Gateway(replicas(1), rate=1 / 8, burst=4).run(burst_case())
n_rejected = sum(r.rejected for r in limited)
print(f"rate limit: {n_rejected} of 12 rejected at once; worst TTFT of the admitted {ttft(limited)} ticks "
      f"(without the limit every request is admitted and the worst waits {ttft(open_door)} ticks)")
assert 0 < n_rejected < 12 and ttft(limited) < ttft(open_door)

# 路由：两个实例，长短请求交替到达
def routing_case():
    return [Request(i, "A", 0, prompt(i), 48 if i % 2 == 0 else 4) for i in range(8)]

rr = Gateway(replicas(2), route="round_robin").run(routing_case())
ll = Gateway(replicas(2), route="least_loaded").run(routing_case())
makespan = {name: max(r.finished for r in reqs) for name, reqs in (("round_robin", rr), ("least_loaded", ll))}
long_on = {name: [r.replica for r in reqs if r.max_tokens == 48] for name, reqs in (("round_robin", rr), ("least_loaded", ll))}
print(f"routing: long requests went to replicas {long_on}; last request done at tick {makespan}")
assert makespan["least_loaded"] < makespan["round_robin"]

# %% [markdown]
# 读数（每一条都有上一格的断言）：
#
# - **优先级**：交互请求插到 batch 任务前面，它们的 TTFT 变短；代价由低优先级的请求承担（它们最长的 TTFT 不会变短）。
# - **配额**：没有配额时，租户 A 的 6 个请求占满引擎，B 要等 A 的请求一个个结束；每个租户最多占 1 个位置时，B 一到就有位置。
# - **限流**：令牌用完的请求立即被拒绝，而不是排在后面等；被接受的请求的最长 TTFT 因此变短。被拒绝的客户端可以稍后重试，
#   或者路由到别的实例 —— 这就是讲义说的 "什么时候扩容、限流或改变路由"。
# - **路由**：轮流发送（round robin）不看负载，长短交替到达时把所有长请求都发给了同一个实例；按未完成的 token 数发送
#   让两个实例的负载接近，最后一个请求结束得更早。
#
# 这些决定用到的只是计数和元数据，一个张量都没碰：它们是控制面。数据面（每个实例的 `step()`）完全没变。

# %% [markdown]
# ## 7. 主流推理框架对比：vLLM、TensorRT-LLM、TGI（架构笔记）
#
# 推理服务架构笔记（"主流推理框架对比"）给出三个框架的核心循环和一张对比表：
#
# | 框架 | 吞吐量 | 延迟 | 内存效率 | 部署难度 |
# | --- | --- | --- | --- | --- |
# | vLLM | ⭐⭐⭐⭐⭐ | ⭐⭐⭐ | ⭐⭐⭐⭐⭐ | ⭐⭐⭐ |
# | TensorRT-LLM | ⭐⭐⭐⭐ | ⭐⭐⭐⭐⭐ | ⭐⭐⭐⭐ | ⭐⭐ |
# | TGI | ⭐⭐⭐ | ⭐⭐⭐⭐ | ⭐⭐⭐ | ⭐⭐⭐⭐ |
#
# 表里的星是笔记作者的定性评价，不是测量：没有硬件、模型、workload，也就没法复现；课上也跑不了 TensorRT-LLM 和 TGI
# （它们要 NVIDIA GPU 和下载的镜像）。能做的是看清每个框架的机制对应本引擎的哪一块，以及每一列在本引擎上怎么量：
#
# | 笔记里的机制 | 本引擎对应的部分 | 在哪里量 |
# | --- | --- | --- |
# | vLLM：`step()` = `scheduler.schedule()` → `model_executor.execute_model()` → `update_with_output()` | `LLMEngine.step` = `Scheduler.schedule` → `ModelRunner.run` → `LLMEngine.postprocess`（下一格从调用树核对） | 本节 |
# | vLLM：PagedAttention，Continuous Batching | `BlockManager` + paged attention；每步重新组 batch | Tutorial 04、03 |
# | TensorRT-LLM：编译优化的引擎、kernel fusion，In-flight Batching | Triton kernel、`torch.compile` 融合的小算子、CUDA graphs；in-flight batching 就是 continuous batching | Tutorial 07，`docs/performance.md` |
# | TGI：Rust 的 router + 流式返回（SSE） | `inferlab serve`（FastAPI + SSE），`LLM.stream` | Tutorial 02 第 6 节，Tutorial 08 第 4b 节 |
#
# 表的四列里，吞吐量和延迟是同一个引擎在不同配置下的取舍（课堂练习的 Q5 用真实运行看这一点），内存效率是 KV 的组织方式
# （Tutorial 04 量过连续预分配的浪费），部署难度量不出来。

# %%
step_children = [name for depth, name in subtree(calls, "LLMEngine.step", nth=0)[1:] if depth == 1]
loop = [n for n in step_children if n in ("Scheduler.schedule", "ModelRunner.run", "LLMEngine.postprocess")]
print("LLMEngine.step calls, in order:", " -> ".join(loop))
assert loop == ["Scheduler.schedule", "ModelRunner.run", "LLMEngine.postprocess"], loop

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** 用 `tracer.spans` 分别算出 prefill 步和 decode 步里 `model forward` 占 `LLMEngine.step` 的比例。哪一种步骤的 control plane 开销比例更高？为什么？
# （提示：`LLMEngine.step` span 的顺序和 log 里 `STEP` 事件的顺序一致。）
#
# **练习 2.** 给 `BlockManager.allocate` 也加一个 span，数一数它在上面的 workload 里被调用了几次，和请求数是什么关系？
#
# **练习 3.**（第 6 节）把限流的 `burst` 从 4 改成 8（`rate` 不变），被拒绝的请求数和被接受请求的最长 TTFT 各怎么变？为什么？
#
# **练习 4.**（架构笔记的 Q5）如何选择适合的推理框架？先写出你的回答，再用本引擎做一个真实的对照：
# 同样 16 个请求，`max_num_seqs=1` 和 `max_num_seqs=16` 各跑一次，比较吞吐（output tok/s）和 TPOT。
# 这组数字对应对比表的哪两列？它说明选框架（或选配置）时要先问什么？
#
# ### 第 7 讲的课堂练习（讲义原文）
#
# 课堂练习可先做一次最小代码导读，建立架构与实现之间的映射关系。
#
# - 定位请求入口。
# - 定位调度循环。
# - 定位 KV 分配和回收逻辑。
# - 定位 metrics 输出点。
#
# **练习一** 在你的架构图中分别标出请求入口、调度器、执行器、状态管理器和指标记录点。
#
# **练习二** 指出哪一个模块最像"全局控制点"，哪一个模块最像"热路径执行点"。
#
# **练习三** 用一句话回答：为什么日志和 benchmark 不应该被排除在系统架构课之外？
#
# 讲义的两个追问：
#
# - 这一链路上，哪个位置属于控制面，哪个位置已经进入数据面？
# - 哪些观测点属于控制面信号，哪些属于执行面信号？
#
# 用第 2 节的 `calls`（真实调用树）、第 3 节的 `tracer`（每个 span 的时间）和 `llm.log.events` 回答。

# %%
# 在这里写你的答案


# %% [markdown answer]
# ### 参考答案

# %% [answer]
# 练习 1
step_events = [e for e in llm.log.events if e["event"] == "STEP"]
step_spans = [s for s in tracer.spans if s["name"] == "LLMEngine.step"]
forward_spans = [s for s in tracer.spans if s["name"] == "model forward"]
share = {True: [], False: []}
for e, st in zip(step_events, step_spans):
    fwd = sum(f["end"] - f["start"] for f in forward_spans if st["start"] <= f["start"] and f["end"] <= st["end"])
    share[e["is_prefill"]].append(fwd / (st["end"] - st["start"]))
for kind, values in ((True, share[True]), (False, share[False])):
    q1, q2, q3 = np.percentile(values, [25, 50, 75])
    print(f"model forward share, {'prefill' if kind else 'decode '} steps: median {q2:.0%} "
          f"(middle half {q1:.0%}-{q3:.0%}, {len(values)} steps)")
(p1, p3), (d1, d3) = np.percentile(share[True], [25, 75]), np.percentile(share[False], [25, 75])
overlap = p1 <= d3 and d1 <= p3
print("the two middle halves overlap: no difference this run can show" if overlap else
      f"control plane share is higher in {'decode' if np.median(share[False]) < np.median(share[True]) else 'prefill'} steps")
# 只在两组数据的中间一半（四分位距）不重叠时才下结论：一次运行里 80% 对 79% 说明不了什么。
# 道理上，decode 步每个序列只算 1 个 token，而调度、准备输入、后处理的开销和 batch 里的序列数成正比，
# 所以 batch 大、模型大时 decode 步的 control plane 比例更高；tiny model 在 CPU 上两者常常分不开，上面的打印会说。

# 练习 2
llm2 = LLM(MODEL, device="auto", max_num_seqs=4)
tracer2 = Tracer()
tracer2.wrap(llm2.block_manager, "allocate", "BlockManager.allocate")
prompts, params = workload(llm2)
llm2.generate(prompts, params, use_tqdm=False)
n_alloc = sum(1 for s in tracer2.spans if s["name"] == "BlockManager.allocate")
n_preempt = sum(1 for e in llm2.log.events if e["event"] == "PREEMPTED")
print(f"allocate called {n_alloc} times for {len(prompts)} requests ({n_preempt} preemptions)")
# 每个请求 prefill 时 allocate 一次；被抢占的请求重新 prefill 时再 allocate 一次
assert n_alloc == len(prompts) + n_preempt

# %% [markdown answer]
# #### 第 7 讲：练习一、练习二（从真实调用树和 span 里读出来）

# %% [answer]
ROLES = {"请求入口": ["LLM.generate", "LLMEngine.enqueue"],
         "调度器（调度循环）": ["LLMEngine.step", "Scheduler.schedule"],
         "执行器": ["ModelRunner.run"],
         "状态管理器（KV 分配 / 回收）": ["BlockManager.allocate", "BlockManager.deallocate"],
         "指标记录点": ["LifecycleLog.emit"]}
called = defaultdict(int)
for _, name in calls:
    called[name] += 1
for role, names in ROLES.items():
    print(f"{role:16} " + ", ".join(f"{n} x{called[n]}" for n in names))
    assert all(called[n] > 0 for n in names), (role, names)

span_total = defaultdict(float)
for s in tracer.spans:
    span_total[s["name"]] += s["end"] - s["start"]
n_steps = sum(1 for e in llm.log.events if e["event"] == "STEP")
per_step = {n: span_total[n] / n_steps * 1e6 for n in ("Scheduler.schedule", "ModelRunner.run")}
print(f"per step: Scheduler.schedule {per_step['Scheduler.schedule']:.0f} us, "
      f"ModelRunner.run {per_step['ModelRunner.run']:.0f} us")
assert per_step["ModelRunner.run"] > per_step["Scheduler.schedule"]

# %% [markdown answer]
# **练习二** 全局控制点是 `Scheduler.schedule`：每一步由它决定谁进 batch、谁等、谁被抢占、分配哪些 block，
# 整个引擎只有这一处做决定。热路径执行点是 `ModelRunner.run`：每一步都跑、占 step 时间的大头（上面每步的微秒数），
# 优化 kernel、CUDA graph 都落在这里。
#
# **控制面 / 数据面的分界** 在 `LLMEngine.step` 调用 `ModelRunner.run` 的那一刻：之前（`Scheduler.schedule`、`BlockManager.allocate`）
# 只动 Python 元数据，之后（`prepare_prefill/decode` 组张量、`model forward`、采样）搬的是张量。
#
# **控制面信号 vs 执行面信号**：下面把 log 里每种事件按它描述的对象分开。

# %% [answer]
CONTROL_EVENTS = {"ARRIVED", "QUEUED", "SCHEDULED", "PREEMPTED", "FINISHED", "FREED"}   # 准入、排队、调度、抢占、释放
DATA_EVENTS = {"FIRST_TOKEN", "TOKEN"}                                                   # 数据面产出了什么
seen = {e["event"] for e in llm.log.events}
step = next(e for e in llm.log.events if e["event"] == "STEP")
print("控制面信号:", sorted(seen & CONTROL_EVENTS))
print("执行面信号:", sorted(seen & DATA_EVENTS), "+ trace 里的 ModelRunner.run / model forward span")
print("STEP 两边都有：", {k: step[k] for k in ("batch_size", "num_waiting", "kv_blocks_used")}, "是控制面的，",
      {k: step[k] for k in ("num_tokens",)}, "是执行面的工作量")
assert seen <= CONTROL_EVENTS | DATA_EVENTS | {"STEP"}, seen - CONTROL_EVENTS - DATA_EVENTS

# %% [markdown answer]
# **练习三** 因为架构图画的是"请求、状态、控制信号如何流动"，而只有日志和 benchmark 能证明它真的这样流动：
# 上面每一个答案都是从 log 和 trace 里读出来的，没有它们，架构图只是静态想象。
#
# #### 练习 3：限流的 burst

# %% [answer]
wider = Gateway(replicas(1), rate=1 / 8, burst=8).run(burst_case())
n_wider = sum(r.rejected for r in wider)
print(f"burst 4: {n_rejected} rejected, worst admitted TTFT {ttft(limited)} ticks")
print(f"burst 8: {n_wider} rejected, worst admitted TTFT {ttft(wider)} ticks")
assert n_wider < n_rejected and ttft(wider) > ttft(limited)

# %% [markdown answer]
# 桶更大，一次涌进来的请求能多进来几个，被拒绝的少了；但进来的请求多了，它们在 gateway 和引擎里排队，
# 最长的 TTFT 变长。burst 就是 "允许多长的队" 的旋钮：拒绝得少和等得短不能同时要，控制面在两者之间选一个点。
#
# #### 练习 4：如何选择推理框架（架构笔记 Q5）
#
# 笔记的回答：根据场景需求选择 —— vLLM 用于高吞吐量场景、内存受限环境；TensorRT-LLM 用于延迟敏感应用，
# 需要 NVIDIA GPU 和工程资源；TGI 用于快速原型和部署、需要流式响应、与 HuggingFace 生态集成；
# 考虑因素包括硬件环境、性能要求、开发维护成本。下面的真实运行说明为什么 "性能要求" 要先拆成吞吐和延迟两个问题：

# %% [answer]
def throughput_and_tpot(max_num_seqs):
    """Output tok/s and median TPOT of one run of 16 requests."""
    prompts = [prompt(i) for i in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    engine = LLM(MODEL, device="auto", max_num_seqs=max_num_seqs, enable_prefix_caching=False)
    start = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    tpot = float(np.median([m.tpot for m in request_metrics(engine.log.events).values()]))
    return sum(len(o["token_ids"]) for o in outs) / wall, tpot


# Three rounds, the two settings taking turns, and the best of each: a slow spell of the machine (another
# program on the same cores) then slows both settings, not only the one that happened to run during it.
rounds = {n: [] for n in (1, 16)}
for _ in range(3):
    for n, results in rounds.items():
        results.append(throughput_and_tpot(n))
configs = {n: (max(tps for tps, _ in results), min(tpot for _, tpot in results)) for n, results in rounds.items()}
for n, (tps, tpot) in configs.items():
    print(f"max_num_seqs={n:2d}: {tps:7.0f} output tok/s, TPOT p50 {tpot * 1e3:.2f} ms")
assert configs[16][0] > 3 * configs[1][0], "batching buys throughput"
assert configs[1][1] < configs[16][1], "a step with one sequence is shorter: lower TPOT"

# %% [markdown answer]
# 同一个引擎、同一批请求：batch 放大到 16，吞吐高出几倍，但每一步要算 16 个序列，每个请求的 TPOT 变长；batch 为 1 时 TPOT 最短，
# 吞吐最低。对比表的 "吞吐量" 和 "延迟" 两列就是这条取舍曲线上的两个位置，一个框架在某一列得高分，往往是它的默认配置和
# 实现选了曲线上的那一头（vLLM 的 PagedAttention 让 batch 能放大，所以吞吐高；TensorRT-LLM 的编译和 kernel 融合缩短每一步，
# 所以延迟低）。所以选框架先问三件事：服务的 SLO 是吞吐还是延迟（Tutorial 08 的 goodput）；硬件是什么（TensorRT-LLM 只在 NVIDIA GPU 上）；
# 团队能维护什么（编译引擎 vs Python 代码 vs 现成的服务镜像）。最后在自己的 workload 上，用同一份请求、同样的计时起点实测，
# 而不是查表。

