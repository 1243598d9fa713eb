# Tutorial 06 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: 推理系统架构

# %% [markdown]
# # Tutorial 06 · 推理系统架构：control plane、data plane 与可观测性
#
# **教学目标**
#
# 1. 把引擎的对象分成两类：**control plane**（决定做什么：`LLMEngine`、`Scheduler`、`BlockManager`、`Sequence`，全是 Python 元数据）
#    和 **data plane**（真正搬数据、做计算：`ModelRunner`、模型、attention、`kv_cache`），并量出两边各占多少内存和时间。
# 2. 从一次真实运行里 **追踪** 出调用链 `LLM.generate → LLMEngine.step → Scheduler.schedule → ModelRunner.run`（用 `sys.setprofile`，不靠读代码）。
# 3. 可观测性的三件套：**log**（发生了什么）、**metrics**（多快、多少）、**trace**（时间花在哪里），都建立在引擎的 lifecycle log 和方法包装之上。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 70 分钟，对应第 7 讲
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 两个平面 | 10 | 表格，无数字 |
# | 2. 调用链 | 15 | 四条调用链都在（断言） |
# | 3. 时间花在哪个平面 | 10 | model forward 约占 step 的 80%，每步 Scheduler.schedule 0.2–0.4 ms、ModelRunner.run 5–10 ms（3 次运行，随机器和负载变） |
# | 4. log / metrics / trace | 10 | 在线 p50 = 离线 p50（断言） |
# | 5. 三条路径 | 10 | 调用关系是确定的（断言：tokenizer 在调度之前，KV 分配 / 回收由调度器发起） |
# | 课堂练习 + 第 7 讲练习 | 15 | prefill / decode 步的 forward 占比：3 次运行里 2 次四分位区间重叠（打印"no difference"），1 次不重叠、decode 步 control plane 比例更高。让学生读打印的判断，不要从一次运行的 1–3 个百分点下结论 |
#
# 练习一的五个角色让学生先在代码里找，再运行答案格子看调用次数。

# %%
import inspect
import json
import logging
import os
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
# | | control plane | data plane |
# | --- | --- | --- |
# | 对象 | `LLM` / `LLMEngine`、`Scheduler`、`BlockManager`、`Sequence`、`LifecycleLog` | `ModelRunner`、`Qwen3ForCausalLM`、attention backend、sampler |
# | 数据 | Python 列表和字典：队列、block table、hash 表、计数 | 张量：权重、`kv_cache`、每一步的 `input_ids` / `slot_mapping` ... |
# | 每一步做什么 | 选 batch、分配 block、记事件、判断停止 | 准备输入张量、前向、采样 |
# | 在哪里跑 | 永远在 CPU 上 | 有 GPU 时在 GPU 上 |
#
# 两者之间唯一的接口是 `ModelRunner.run(seqs, is_prefill)`：control plane 交出一组 `Sequence`，拿回每个序列的新 token。

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
REF_DIR = os.path.dirname(inspect.getfile(LLM))   # the engine package: reference/ (student_exercises/ in a release)


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

# %%
fig, ax = plt.subplots(figsize=(9, 2.8))
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
# - control plane（绿色）每步只有几十微秒：选 batch、分配 block、记事件，都是 Python 对少量对象的操作，和模型大小无关。
# - 在 CPU 上，即使是 tiny model，model forward 也占大头：每个 PyTorch 算子在 CPU 上都有微秒级的固定开销，2 层的模型一步就有上百个算子。
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
fig, ax = plt.subplots(figsize=(11, 3.2))
palette = {"LLMEngine.step": "#dddddd", "Scheduler.schedule": "#2ca02c", "ModelRunner.run": "#aec7e8",
           "prepare inputs": "#6baed6", "model forward": "#1f77b4", "LLMEngine.postprocess": "#98df8a"}
for s in tracer.spans:
    if window[0] <= s["start"] and s["end"] <= window[1]:
        ax.barh(-s["depth"], (s["end"] - s["start"]) * 1e3, left=(s["start"] - window[0]) * 1e3,
                color=palette[s["name"]], edgecolor="white")
ax.set(xlabel="ms", yticks=[0, -1, -2], yticklabels=["step", "schedule / run / postprocess", "prepare / forward"],
       title="trace of the first 4 steps")
fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()], labels=list(palette),
           fontsize=8, ncols=6, loc="lower center")
plt.tight_layout(rect=(0, 0.1, 1, 1))
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
fig, ax = plt.subplots(figsize=(13, 2.8))
GAP = 2.3
for lane, (path, names) in enumerate(PATHS.items()):
    names = sorted(names, key=first.get)
    y = 2 - lane
    ax.text(-1.3, y, path, ha="right", va="center", fontsize=9, fontweight="bold")
    for j, name in enumerate(names):
        ax.text(j * GAP, y, name, ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round", fc=["#fde0dd", "#deebf7", "#e5f5e0"][lane]))
        if j:
            ax.annotate("", xy=(j * GAP - 1.05, y), xytext=((j - 1) * GAP + 1.05, y), arrowprops=dict(arrowstyle="->"))
ax.set(xlim=(-4.2, 6 * GAP + 1.3), ylim=(-0.6, 2.6))
ax.axis("off")
ax.set_title("three paths of one generate(), in first-call order (from sys.setprofile)")
plt.tight_layout()
plt.show()
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
# - **tokenizer** 在请求路径的最前面（`LLM._submit → LLMEngine.tokenize`），早于第一次 `Scheduler.schedule`：它在 CPU 上、在 control plane 这一侧，
#   不占 GPU 的 step 时间；真实服务里它常常放在 API server 进程里。
# - **KV 分配 / 回收** 由 `Scheduler`（`_schedule_prefill → BlockManager.allocate`，`finish → BlockManager.deallocate`）发起：
#   决定 "给谁 block" 的是控制面；`ModelRunner` 只按 block table 读写 `kv_cache`（数据面）。
# - **观测点** 分布在引擎和调度器两处（`LifecycleLog.emit` 的调用者）：请求进入、调度决定、token 产出、结束各记一条 —— 观测路径贯穿两个平面，
#   这就是讲义说日志 "属于架构" 的原因。

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** 用 `tracer.spans` 分别算出 prefill 步和 decode 步里 `model forward` 占 `LLMEngine.step` 的比例。哪一种步骤的 control plane 开销比例更高？为什么？
# （提示：`LLMEngine.step` span 的顺序和 log 里 `STEP` 事件的顺序一致。）
#
# **练习 2.** 给 `BlockManager.allocate` 也加一个 span，数一数它在上面的 workload 里被调用了几次，和请求数是什么关系？
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
DATA_EVENTS = {"FIRST_TOKEN", "TOKEN"}                                                   # 模型算出了什么
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

