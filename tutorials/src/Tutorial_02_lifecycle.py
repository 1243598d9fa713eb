# Tutorial 02 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: 请求生命周期与PrefillDecode

# %% [markdown]
# # Tutorial 02 · 请求生命周期：Prefill 与 Decode
#
# **教学目标**
#
# 1. 说出一个请求在引擎里经过的状态：queued → prefill → decode → finished，以及 preempted（被抢占后重新排队）。
# 2. 从 lifecycle log 画出每个请求的时间线（timeline），看懂 prefill-first 调度下 decode 为什么会"停顿"。
# 3. 把 TTFT 拆成三段：**queue**（排队）+ **schedule**（调度开销）+ **prefill**（前向计算、采样、后处理），并说明为什么少了第 1 讲的 T_return。
# 4. 看 chat template 如何把一句很短的话变成长得多的 prompt。
# 5. 从模型的形状算出 prefill 和 decode 的 arithmetic intensity（roofline），再看这台 CPU 和课程记录的 H100 上量到了什么、为什么不一样。
# 6. 第 1 讲的端到端公式：为什么写成 (N_out − 1)·TPOT，怎样用它预测一个请求的 e2e；看流式返回如何扣住被拆开的汉字。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 90 分钟，对应第 3 讲（第 6 节对应第 1 讲的公式）
#
# 下表每个数字都有格子里的断言（括号里是断言的界）；只说 "随机器变" 的数字没有断言，不要拿它们和学生对答案。
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 小场景 | 10 | 191 步、8 个请求、7 次抢占（确定：固定种子、`ignore_eos`） |
# | 2. 时间线 | 15 | stalled 8 步、preempted 157 步（确定） |
# | 3. TTFT 分解 | 10 | 三段之和 = TTFT（断言，误差 < 1 µs）；毫秒数随机器变。讲清 T_return 为什么不在这里 |
# | 4. chat template | 5 | token 数严格递增（断言） |
# | 5. roofline 与实测 | 20 | FLOPs 公式 = `FlopCounterMode`（断言，确定）；Qwen3-0.6B 形状：prefill 512 的 I > ridge > 10 × decode batch 256 的 I（断言）；CPU：16 倍 token 时 prefill 步的涨幅 > 2 × decode 步的涨幅，512 → 2048 个 token 涨 > 4 倍（断言；tiny 的 n² 项）；H100 记录：decode 一个 token 的成本 > 5 × prefill、batch ≥ 40 时读 KV ≥ 90% 拷贝带宽（断言） |
# | 6. 端到端公式与流式返回 | 10 | decode 步数 = N_out − 1（断言，确定）；16 个 token 的请求预测 64 个 token 的 e2e，误差 < 30%（断言；通常偏低 5%–20%）；"好" 被拆成 3 个 token，扣住 2 次（确定） |
# | 课堂练习 + 第 3 讲练习 | 20 | TTFT 总和中 queue 是主导项（断言）；多算的 prefill token 304（确定） |
#
# 第 3 讲的练习一到三先让学生在纸上画时序图，再运行答案格子对照五个节点的 step。

# %%
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib.pyplot as plt
import torch

from courseware.tiny_model import ensure_tiny_model
from reference import LLM, SamplingParams
from reference.metrics import check_lifecycle, request_metrics

MODEL = os.environ.get("INFERLAB_MODEL") or str(ensure_tiny_model())
if torch.cuda.is_available():
    # GPU 上第一次 prefill 要编译 kernel（一次性的开销），不先跑一遍，下面第一批请求的 TTFT 就几乎全是编译时间
    LLM(MODEL, device="auto").generate([list(range(1, 40))] * 2, SamplingParams(max_tokens=4, ignore_eos=True),
                                       use_tqdm=False)
else:
    torch.set_num_threads(1)  # tiny model：单线程更快

# %% [markdown]
# ## 1. 一个会排队、也会被抢占的小场景
#
# 为了在一张图里看到所有状态，我们故意把资源设得很紧：
#
# - `max_num_seqs=4`：最多 4 个请求同时 running；
# - `num_kvcache_blocks=12`，`kvcache_block_size=16`：整个 KV cache 只有 192 个 token 的位置；
# - 请求不是一次全部到达，而是每隔几步来两个（下面的 `arrivals`）。
#
# 每个请求最长约 100 个 token（7 个 block），4 个一起跑到最后最多要 28 个 block，比 12 个多，所以一定会发生 **preemption**。
# `ignore_eos=True` 让每个请求正好生成 `max_tokens` 个 token，实验可重复。

# %%
llm = LLM(MODEL, device="auto", max_num_seqs=4, kvcache_block_size=16, num_kvcache_blocks=12,
          enable_prefix_caching=False)
vocab = llm.config.hf_config["vocab_size"]
rng = random.Random(0)
requests = [([rng.randrange(vocab - 3) for _ in range(rng.randint(20, 40))],
             SamplingParams(temperature=0.0, max_tokens=rng.randint(30, 60), ignore_eos=True))
            for _ in range(8)]
arrivals = {0: requests[0:2], 6: requests[2:4], 12: requests[4:6], 30: requests[6:8]}  # step -> new requests

# 记录每一步的时间点：调度开始、模型运行开始。TTFT 分解要用。
marks = {}
orig_schedule, orig_run = llm.scheduler.schedule, llm.model_runner.run


def timed_schedule():
    marks.setdefault(llm.step_index, {})["schedule_start"] = time.perf_counter()
    return orig_schedule()


def timed_run(seqs, is_prefill):
    marks[llm.step_index]["run_start"] = time.perf_counter()
    return orig_run(seqs, is_prefill)


llm.scheduler.schedule, llm.model_runner.run = timed_schedule, timed_run

while arrivals or not llm.is_finished():
    for prompt, sp in arrivals.pop(llm.step_index, []):
        llm.add_request(prompt, sp)
    if llm.is_finished():          # 没有请求在跑：时间"快进"到下一批到达
        llm.step_index = min(arrivals)
        continue
    llm.step()

events = llm.log.events
assert check_lifecycle(events) == [], check_lifecycle(events)
num_preempted = sum(e["event"] == "PREEMPTED" for e in events)
print(f"{llm.step_index} steps, {len(requests)} requests, {num_preempted} preemptions")
assert num_preempted > 0

# %% [markdown]
# > 注意：没有请求在跑时，上面的循环直接把 `step_index` 跳到下一批请求的到达步。
# > 这只是为了让到达时间用 "step" 表示、结果可重复；真实的服务器会空等。

# %% [markdown]
# ## 2. 从 log 还原每一步的状态
#
# 对每个请求、每一步，状态取决于它这一步的事件：
#
# | 状态 | 判断 |
# | --- | --- |
# | queued | 已 `ARRIVED`，还没有第一次 `SCHEDULED` |
# | prefill / decode | 这一步有 `SCHEDULED`，看 `is_prefill` |
# | stalled | running（持有 KV block），但这一步没有被调度：prefill-first 策略下，有新请求 prefill 时，正在 decode 的请求要等这一步 |
# | preempted | `PREEMPTED` 之后、再次 `SCHEDULED` 之前（block 已全部释放，回到 waiting 队列最前面） |

# %%
def states_per_step(events, num_steps):
    """{seq_id: [state or None for each step]} rebuilt from the lifecycle log alone."""
    by_seq = {}
    for e in events:
        if e["seq_id"] is not None:
            by_seq.setdefault(e["seq_id"], []).append(e)
    table = {}
    for seq_id, evs in by_seq.items():
        row = [None] * num_steps
        state = None
        scheduled_at = {e["step"]: e["is_prefill"] for e in evs if e["event"] == "SCHEDULED"}
        marks_at = {}
        for e in evs:
            marks_at.setdefault(e["step"], []).append(e["event"])
        for step in range(num_steps):
            names = marks_at.get(step, [])
            if "ARRIVED" in names:
                state = "queued"
            if step in scheduled_at:
                state = "running"
                row[step] = "prefill" if scheduled_at[step] else "decode"
            elif "PREEMPTED" in names:
                state = "preempted"
            if row[step] is None and state is not None:
                row[step] = "stalled" if state == "running" else state
            if "FINISHED" in names:
                state = None
        table[seq_id] = row
    return table


states = states_per_step(events, llm.step_index)
COLORS = {"queued": "#bbbbbb", "prefill": "#d62728", "decode": "#1f77b4", "stalled": "#ffbf00",
          "preempted": "#9467bd"}
fig, ax = plt.subplots(figsize=(7, 3.4))
for seq_id, row in states.items():
    for step, state in enumerate(row):
        if state is not None:
            ax.barh(seq_id, 1, left=step, color=COLORS[state], edgecolor="none")
    finished = next(e["step"] for e in events if e["event"] == "FINISHED" and e["seq_id"] == seq_id)
    ax.plot(finished + 1, seq_id, marker="|", color="black", markersize=12)
ax.set_xlabel("engine step")
ax.set_ylabel("request id")
ax.invert_yaxis()
ax.set_title("per-request timeline (| = finished)")
fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()], labels=list(COLORS),
           ncols=5, loc="lower center")
plt.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %% [markdown]
# 从图上能读出：
#
# - 红色的 prefill 只占一步（prompt 一次算完）；蓝色的 decode 一步一个 token。
# - 有新请求到达的那一步，其他请求是黄色（stalled）：这是 prefill-first 调度的代价，decode 的 inter-token latency 会出现尖峰。
# - 紫色（preempted）：KV cache 用完时，有一个请求交出全部 block、回到队列最前，之后要 **重新 prefill**（再一次红色）。
#   交出 block 的是谁，由调度策略决定：课程的 scheduler（lab 3 实现）让 **最新加入** 的请求让位；
#   lab 1、lab 2 的 release 里跑的是 stand-in scheduler，让 **要不到 block 的那个请求** 自己让位，
#   所以在那里看到的被抢占的请求、抢占次数和总步数会和课程引擎不同，图的形状是一样的。

# %%
for seq_id, row in states.items():
    n_prefill = row.count("prefill")
    if row.count("preempted"):
        print(f"request {seq_id}: preempted for {row.count('preempted')} steps, prefilled {n_prefill} times")

# %% [markdown]
# ### 2.1 `Sequence`：请求跨阶段存活的那个对象（第 3 讲）
#
# 第 3 讲："如果不能说清 Sequence 承载了哪些字段，就很难讲明请求是如何跨阶段存活的"，并点名四个字段：
# `status`、`num_cached_tokens`、`block_table`、`last_block_num_tokens`。跟着一个请求（block 大小 16，prompt 30 个 token）走一遍：

# %%
solo = LLM(MODEL, device="auto", kvcache_block_size=16, enable_prefix_caching=False)
solo_id = solo.add_request(list(range(1, 31)), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
seq = solo.scheduler.waiting[0]
FIELDS = ("status", "num_cached_tokens", "block_table", "last_block_num_tokens")


def fields(seq):
    return {"len": len(seq), **{name: getattr(seq, name) for name in FIELDS}, "block_table": list(seq.block_table)}


trail = [("after add_request", fields(seq))]
while not solo.is_finished():
    solo.step()
    trail.append((f"after step {solo.step_index - 1}", fields(seq)))
for when, f in trail:
    print(f"{when:18} len={f['len']:2d} status={f['status'].name:8} cached={f['num_cached_tokens']:2d} "
          f"block_table={f['block_table']} last_block_num_tokens={f['last_block_num_tokens']}")
assert [f["status"].name for _, f in trail][:2] == ["WAITING", "RUNNING"] and trail[-1][1]["status"].name == "FINISHED"
running = [f for _, f in trail if f["status"].name == "RUNNING"]
assert all(f["last_block_num_tokens"] == f["len"] - 16 * ((f["len"] - 1) // 16) for f in running)
assert all(len(f["block_table"]) == -(-f["num_cached_tokens"] // 16) for f in running)   # blocks hold the cached K/V
assert trail[-1][1]["block_table"] == [] and trail[-1][1]["num_cached_tokens"] == 0

# %% [markdown]
# 四个字段把 "请求内容、调度状态、KV 元数据" 压在同一个对象上（讲义的原话）：`status` 是调度器看的（waiting → running → finished），
# `num_cached_tokens` 是已经有 K/V 的 token 数（prefill 之后等于整个 prompt，decode 时每步加一），`block_table` 是它的 KV 放在哪些物理 block 里，
# `last_block_num_tokens` 是按长度算的最后一个 block 里的 token 数 —— 长度到 33 时它回到 1。注意 `block_table` 晚一步才多出第 3 个 block：
# 刚采样出来的第 33 个 token 还没有 K/V，要等下一步把它的 K/V 写进 cache 时才需要新 block，所以 block 数始终是
# `num_cached_tokens` 除以 16 向上取整（断言；`docs/design.md` 的 edge case 5）。
# 请求结束时 block 还给 pool，`block_table` 被清空、`num_cached_tokens` 归零（断言）：这就是讲义说的 "完成后的尾部动作"。

# %% [markdown]
# ## 3. TTFT = queue + schedule + prefill
#
# 对每个请求（时间都来自 `time.perf_counter()`，和 log 用的是同一个时钟）：
#
# - **queue** = 它第一次被调度的那一步开始调度的时刻 − `ARRIVED`
# - **schedule** = 那一步 `ModelRunner.run` 开始的时刻 − 调度开始的时刻（`Scheduler.schedule` 和 log 的开销）
# - **prefill** = `FIRST_TOKEN` − `ModelRunner.run` 开始（前向计算、采样、后处理）
#
# 三段首尾相接，所以和一定等于 `FIRST_TOKEN − ARRIVED`，也就是 `reference.metrics` 算出的 TTFT。
#
# **和第 1 讲的不同**：讲义的公式是 $TTFT = T_{\text{queue}} + T_{\text{schedule}} + T_{\text{prefill}} + T_{\text{return}}$。
# 这里没有 $T_{\text{return}}$（首个 token 从引擎交到用户手里：detokenize、扣住半个汉字、HTTP/SSE 写回），
# 因为本节的 TTFT 按 vLLM 和 `reference.metrics` 的定义，在引擎采样出第一个 token（`FIRST_TOKEN`）时截止，而 lifecycle log
# 只记录引擎里发生的事。第 6 节在客户端把 $T_{\text{return}}$ 量出来；Tutorial 08 的 HTTP 服务里它还包括网络和 SSE。

# %%
metrics = request_metrics(events)
rows = []
for seq_id, m in metrics.items():
    evs = [e for e in events if e["seq_id"] == seq_id]
    arrived = next(e for e in evs if e["event"] == "ARRIVED")
    first_sched = next(e for e in evs if e["event"] == "SCHEDULED")
    first_token = next(e for e in evs if e["event"] == "FIRST_TOKEN")
    step_marks = marks[first_sched["step"]]
    queue = step_marks["schedule_start"] - arrived["time"]
    schedule = marks[first_token["step"]]["run_start"] - step_marks["schedule_start"]
    prefill = first_token["time"] - marks[first_token["step"]]["run_start"]
    assert abs((queue + schedule + prefill) - m.ttft) < 1e-6   # equal up to float rounding
    rows.append((seq_id, queue * 1e3, schedule * 1e3, prefill * 1e3, m.ttft * 1e3))
    print(f"request {seq_id}: queue {queue * 1e3:7.2f} ms + schedule {schedule * 1e3:5.2f} ms "
          f"+ prefill {prefill * 1e3:6.2f} ms = TTFT {m.ttft * 1e3:7.2f} ms")

# %%
fig, (ax, ax_pct) = plt.subplots(1, 2, figsize=(7, 3.0))
ids = [r[0] for r in rows]
bottom, bottom_pct = [0.0] * len(rows), [0.0] * len(rows)
for k, (name, color) in enumerate([("queue", "#bbbbbb"), ("schedule", "#2ca02c"), ("prefill", "#d62728")], start=1):
    values = [r[k] for r in rows]
    pct = [100 * r[k] / r[4] for r in rows]
    ax.bar(ids, values, bottom=bottom, color=color, label=name)
    ax_pct.bar(ids, pct, bottom=bottom_pct, color=color, label=name)
    bottom = [b + v for b, v in zip(bottom, values)]
    bottom_pct = [b + v for b, v in zip(bottom_pct, pct)]
ax.set(xlabel="request id", ylabel="ms", title="TTFT = queue + schedule + prefill")
ax_pct.set(xlabel="request id", ylabel="% of TTFT", title="the same, as shares of TTFT")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# 同一批到达的两个请求在同一步里一起 prefill，所以它们的 schedule 段和 prefill 段一样长；
# 差别在 queue：前面的请求还占着位置（`max_num_seqs`）或 KV block 不够时，新请求只能等。
# 在 CPU 上的 tiny model 里 schedule 只占 TTFT 的百分之几；负载越高，queue 的比例越大 —— Tutorial 08 会系统地测这一点。

# %% [markdown]
# ## 4. Chat template 让 prompt 变长
#
# 聊天模型不直接吃用户的一句话，而是吃一段套上角色标记的文本（ChatML：`<|im_start|>role ... <|im_end|>`）。
# `tokenizer.apply_chat_template` 负责套模板；多轮对话时，**整段历史** 每轮都要重新作为 prompt。

# %%
tok = llm.tokenizer
question = "什么是 KV cache？"
system = {"role": "system", "content": "You are a patient tutor who explains LLM inference step by step."}
history = [
    {"role": "user", "content": "Why is decode slower per token than prefill?"},
    {"role": "assistant", "content": "Because each decode step reads every weight to produce only one token."},
]
cases = {
    "raw text": question,
    "user only": [{"role": "user", "content": question}],
    "system + user": [system, {"role": "user", "content": question}],
    "system + 1 turn history + user": [system, *history, {"role": "user", "content": question}],
}
lengths = {}
for name, conv in cases.items():
    text = conv if isinstance(conv, str) else tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    lengths[name] = len(llm.tokenize(text))
    print(f"{name:32} {lengths[name]:4d} tokens")
print()
print(tok.apply_chat_template(cases["system + user"], add_generation_prompt=True, tokenize=False))
assert lengths["raw text"] < lengths["user only"] < lengths["system + user"] < lengths["system + 1 turn history + user"]

# %% [markdown]
# 一句只有几个 token 的问题，加上 system prompt 和一轮历史以后变成几十个 token：
# prefill 的工作量、TTFT 和 KV cache 占用都跟着涨。这正是 Tutorial 05（prefix caching）要解决的问题：
# 多轮对话里，历史部分每一轮都一样，没必要每轮都重算。

# %% [markdown]
# ## 5. Prefill 与 decode：arithmetic intensity（roofline），再量一量
#
# 第 3 讲的核心区分：prefill "更计算密集"，decode "单轮较轻，但迭代频繁，更依赖状态驻留"。把它变成可以算的数，
# 用的是 **arithmetic intensity**（算术强度）：一步做的浮点运算除以这一步必须搬的字节数。
#
# $$I = \frac{\text{FLOPs}}{\text{bytes moved}} \qquad\text{ridge} = \frac{\text{峰值算力 (FLOP/s)}}{\text{显存带宽 (byte/s)}}$$
#
# $I$ 高于 ridge 的一步受算力限制（compute-bound），低于它的受带宽限制（memory-bound）：这就是 **roofline** 模型。
# 一步的两类开销，全部可以从模型的形状（`config.json`）算出来（$n$ 是这一步算的新 token 数，$b$ 是每个值的字节数，
# $P$ 是每层线性层的权重数乘层数 $L$，$H$、$d$ 是 query head 数和 head_dim，$n_{kv}$ 是 KV head 数）：
#
# - 线性层（QKV、o、MLP）：$2nP$ 次浮点运算，权重每一步读一遍，$Pb$ 字节 —— 和 batch 里有多少 token 无关；
# - attention：prefill 一个 $n$ 个 token 的 prompt 算 $QK^\top$ 和 $PV$，$4n^2HdL$（整个 $n\times n$ 矩阵，本引擎 CPU 上的
#   torch backend 就是这样算的；flash attention 只算因果的一半）；decode 一个 batch 的 $B$ 个序列、每个上下文 $c$，
#   算 $4BcHdL$，还要把 $Bc$ 个 token 的 K/V 读一遍，$2Bc\,n_{kv} d\, b L$ 字节。
#
# 所以 prefill 的 $I \approx 2n/b$ 随 prompt 变长而变大；decode 的 $I$ 在 batch 大时趋向 $2H/(n_{kv} b)$ ——
# 每读一个 K/V 值只做几次运算，**和 batch 多大无关**。下面先用一条独立的路线核对公式：PyTorch 的 `FlopCounterMode`
# 数出 transformers 的 tiny model 做一次 prefill 真正调用了多少次浮点运算。

# %%
import json

import numpy as np
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

with open(os.path.join(MODEL, "config.json")) as f:
    tiny = json.load(f)
# Qwen3-0.6B 的形状（课程在 GPU 上 benchmark 用的就是它，docs/performance.md）
QWEN3_06B = {"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936}


def linear_weights(cfg):
    """Weights of the per-layer linear layers (QKV, o, gate/up, down) of all layers: P in the text."""
    h, q, kv, inter = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"], \
        cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
    return cfg["num_hidden_layers"] * (h * (q + 2 * kv) + q * h + h * 2 * inter + inter * h)


def prefill_cost(cfg, n, b):
    """(FLOPs, bytes) of prefilling one n-token prompt: full n x n attention, weights read once, K/V written."""
    attn = 4 * n * n * cfg["num_attention_heads"] * cfg["head_dim"] * cfg["num_hidden_layers"]
    lm_head = 2 * cfg["hidden_size"] * cfg["vocab_size"]                       # logits of the last token only
    kv_bytes = 2 * n * cfg["num_key_value_heads"] * cfg["head_dim"] * b * cfg["num_hidden_layers"]
    return 2 * n * linear_weights(cfg) + attn + lm_head, (linear_weights(cfg) + cfg["hidden_size"] * cfg["vocab_size"]) * b + kv_bytes


def decode_cost(cfg, batch, context, b):
    """(FLOPs, bytes) of one decode step: `batch` sequences, each attending to `context` cached tokens."""
    heads, kv, d, layers = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_hidden_layers"]
    flops = 2 * batch * linear_weights(cfg) + 4 * batch * context * heads * d * layers \
        + 2 * batch * cfg["hidden_size"] * cfg["vocab_size"]
    return flops, (linear_weights(cfg) + cfg["hidden_size"] * cfg["vocab_size"]) * b \
        + 2 * batch * context * kv * d * b * layers


hf_logging.disable_progress_bar()
hf = AutoModelForCausalLM.from_pretrained(MODEL, attn_implementation="eager", dtype=torch.float32).eval()
for n in (128, 512):
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        hf(torch.randint(0, tiny["vocab_size"] - 3, (1, n)), logits_to_keep=1)
    print(f"prefill {n} tokens: formula {prefill_cost(tiny, n, 4)[0]:,} FLOPs, FlopCounterMode {counter.get_total_flops():,}")
    assert prefill_cost(tiny, n, 4)[0] == counter.get_total_flops()

# %% [markdown]
# 公式和实际调用的运算次数完全一致。现在对 Qwen3-0.6B 的形状（bf16，$b=2$）算两种步骤的 $I$，和 H100 的 ridge 比一比。
# ridge 用课程自己在 H100 上 **记录的** 两个数（不是厂商的标称值）：GEMM 的实测算力（一个 prefill 步的 112 个投影单独跑，
# `scripts/profile_prefill.py`）和实测的拷贝带宽（`band_windows_probe.py`），文件在课程仓库的 `docs/results/`。
# 这份 notebook 不在课程仓库里运行时（例如学生的 release），那些文件不在，下面的格子会说明并跳过 GPU 的数字。

# %%
RESULTS = os.path.join(os.pardir, "docs", "results")           # the course repository's recorded GPU runs
PREFILL_RUN = os.path.join(RESULTS, "2026-11-25", "prefill_all.json")
DECODE_RUN = os.path.join(RESULTS, "2026-11-25", "session12", "call1_band_windows.json")
RECORDED = os.path.isfile(PREFILL_RUN) and os.path.isfile(DECODE_RUN)
if RECORDED:
    with open(PREFILL_RUN) as f:
        prefill_rec = json.load(f)
    with open(DECODE_RUN) as f:
        decode_rec = json.load(f)
    peak_flops, bandwidth = prefill_rec["gemm_tflops"] * 1e12, decode_rec["copy_GBps"] * 1e9
    print(f"H100 80GB HBM3（记录于 2026-11-25，docs/performance.md session 6 / session 12）："
          f"GEMM {peak_flops / 1e12:.0f} TFLOP/s，拷贝 {bandwidth / 1e12:.2f} TB/s → ridge {peak_flops / bandwidth:.0f} FLOP/byte")
else:
    print("docs/results/ 不在这里（不是课程仓库）：GPU 的记录数字见课程仓库的 docs/performance.md；下面只算形状")
    peak_flops, bandwidth = None, None
ridge = peak_flops / bandwidth if RECORDED else None

print(f"{'step':34} {'FLOPs':>10} {'bytes':>10} {'I (FLOP/byte)':>14}")
intensity = {}
for name, (flops, nbytes) in {
        "prefill, 1 prompt of 512": prefill_cost(QWEN3_06B, 512, 2),
        "prefill, 1 prompt of 2048": prefill_cost(QWEN3_06B, 2048, 2),
        "decode, batch 1, context 550": decode_cost(QWEN3_06B, 1, 550, 2),
        "decode, batch 256, context 550": decode_cost(QWEN3_06B, 256, 550, 2)}.items():
    intensity[name] = flops / nbytes
    print(f"{name:34} {flops:10.2e} {nbytes:10.2e} {flops / nbytes:14.1f}")
gqa_limit = 2 * QWEN3_06B["num_attention_heads"] / (QWEN3_06B["num_key_value_heads"] * 2)
print(f"decode 的 attention 部分：每读一个字节 {gqa_limit:.0f} 次运算（2·H / (n_kv·b)），batch 再大也不变")
assert intensity["prefill, 1 prompt of 512"] > 100 * intensity["decode, batch 1, context 550"]
assert intensity["decode, batch 256, context 550"] < 10 * gqa_limit
if RECORDED:
    assert intensity["prefill, 1 prompt of 512"] > ridge > 10 * intensity["decode, batch 256, context 550"]

# %%
from matplotlib.ticker import FuncFormatter, NullFormatter


def plain_log_ticks(ax):
    """Label log axes 1, 10, 100 instead of 10^0, 10^1, 10^2 (printed exponents would be 70% of the label size)."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            axis.set_minor_formatter(NullFormatter())

fig, ax = plt.subplots(figsize=(6.5, 3.6))
ax.set(xscale="log", yscale="log")
roof_x = np.logspace(-0.5, 3.5, 200)
if RECORDED:
    ax.loglog(roof_x, np.minimum(peak_flops, bandwidth * roof_x) / 1e12, color="gray", label="H100 roof (recorded)")
points = {"prefill": [(n, prefill_cost(QWEN3_06B, n, 2)) for n in (128, 512, 2048)],
          "decode": [(batch, decode_cost(QWEN3_06B, batch, 550, 2)) for batch in (1, 16, 256)]}
for (kind, pts), (marker, color) in zip(points.items(), (("o", "#d62728"), ("s", "#1f77b4"))):
    xs = [f / nb for _, (f, nb) in pts]
    ys = [min(peak_flops, bandwidth * x) / 1e12 if RECORDED else 1.0 for x in xs]
    ax.scatter(xs, ys, marker=marker, color=color, zorder=3, label=kind)
    for (size, _), x, y in zip(pts, xs, ys):
        ax.annotate(f"{'n' if kind == 'prefill' else 'B'}={size}", (x, y), textcoords="offset points",
                    xytext=(4, -12 if kind == "decode" else 6), fontsize=8)
ax.set(xlabel="arithmetic intensity (FLOP/byte)", ylabel="attainable TFLOP/s",
       title="Qwen3-0.6B shape, bf16: prefill vs decode")
plain_log_ticks(ax)
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# 读图（上面的断言保证）：prefill 一个几百 token 的 prompt，$I$ 就已经在 ridge 右边 —— 受算力限制，时间跟着 FLOPs 走；
# decode 即使 batch 到 256，也在 ridge 左边很远 —— 每一步的时间是 **把权重和 KV cache 读一遍** 的时间，
# batch 变大只是让同一次读取分给更多 token。这就是讲义说 decode "更依赖状态驻留" 的定量含义：decode 的成本是 KV 这个状态的大小。

# %% [markdown]
# ### 5.1 在这台机器（CPU）上量：tiny model 量到的是什么
#
# 下面量每一步的时间（固定在 CPU 上：tiny model 在 GPU 上太小，每一步几乎全是 kernel launch 的固定开销）：
#
# - prefill：一个请求，prompt 从 32 到 2048 个 token，量 prefill 那一步；
# - decode：batch 里 1 到 16 个请求，量 decode 步。
#
# 每个点量 5 次取最小值：别的进程抢 CPU 只会让一次测量变慢、不会变快，所以最小值最接近这台机器本来的速度
# （一步里的几个 decode 步仍取中位数）。5 轮交错着量（每轮把所有点各量一次）：机器忙的那几秒只拖慢一轮，
# 而不是某一个点的全部 5 次。

# %%
def timed_steps(prompt_lens, max_tokens, decode_steps=0):
    """Median wall time of the prefill step and of the next `decode_steps` decode steps."""
    engine = LLM(MODEL, device="cpu", enable_prefix_caching=False, max_num_seqs=64,
                 max_num_batched_tokens=max(4096, sum(prompt_lens)))
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for n in prompt_lens:
        engine.add_request([(7 * i + n) % (vocab - 3) for i in range(n)], sp)
    times = []
    for _ in range(1 + decode_steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return times[0], float(np.median(times[1:])) if decode_steps else None


timed_steps([16], 2, 1)                                       # warm-up
PREFILL_TOKENS, DECODE_BATCH = [32, 128, 512, 2048], [1, 2, 4, 8, 16]
prefill_s = {n: float("inf") for n in PREFILL_TOKENS}
decode_s = {b: float("inf") for b in DECODE_BATCH}
for _ in range(5):                                            # rounds interleave the points: a busy second
    for n in PREFILL_TOKENS:                                  # on the machine slows one round, not one point
        prefill_s[n] = min(prefill_s[n], timed_steps([n], 1)[0])
    for b in DECODE_BATCH:
        decode_s[b] = min(decode_s[b], timed_steps([16] * b, 8, 5)[1])
for n, t in prefill_s.items():
    print(f"prefill {n:5d} tokens: {t * 1e3:7.2f} ms/step  {t / n * 1e6:7.1f} us/token")
for b, t in decode_s.items():
    print(f"decode batch {b:3d}: {t * 1e3:7.2f} ms/step  {t / b * 1e6:7.1f} us/token")

fig, ax = plt.subplots(figsize=(6.5, 3.4))
ax.loglog(PREFILL_TOKENS, [prefill_s[n] / n * 1e6 for n in PREFILL_TOKENS], "o-", color="#d62728", label="prefill (1 request)")
ax.loglog(DECODE_BATCH, [decode_s[b] / b * 1e6 for b in DECODE_BATCH], "s-", color="#1f77b4", label="decode (batch)")
ax.set(xlabel="tokens computed in the step", ylabel="us per token", title="cost per token (tiny model, CPU)")
plain_log_ticks(ax)
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

prefill_growth = prefill_s[2048] / prefill_s[128]         # 16x tokens
decode_growth = decode_s[16] / decode_s[1]                # 16x tokens
print(f"16x tokens: prefill step {prefill_growth:.1f}x longer, decode step {decode_growth:.1f}x longer")
assert prefill_growth > 2 * decode_growth, "prefill time follows the tokens; decode time barely follows the batch"

# %% [markdown]
# 读数（上一格的断言保证）：decode 一步的时间几乎不随 batch 增长，每个 token 的成本随 batch 下降 —— 所以 decode 要靠
# **batching** 提高效率（Tutorial 03）；prefill 一步的时间跟着 token 数涨。
#
# 但 **这不是 "prefill compute-bound 所以随 token 线性增长"**，也不是大模型在 GPU 上的形状。看 tiny model 的形状：
# hidden 只有 64，每个 token 的线性层运算很少，而 attention 的 $n\times n$ 那一项随 $n^2$ 增长，几百个 token 以后它就占了大头；
# CPU 上的 torch backend 还要把整个 $n\times n$ 的分数矩阵（fp32，每层每个 head 一份）写出来、做 `masked_fill` 和 `softmax`，
# 2048 个 token 时这个矩阵早已放不进 CPU 的 cache，每一遍都在搬内存。所以从 512 到 2048，时间的增长比 token 数（4 倍）快得多。
# 下一格从形状算出这一点，并和量到的比一比。

# %%
def attention_share(cfg, n):
    """Fraction of a prefill step's FLOPs in the n x n attention term."""
    attn = 4 * n * n * cfg["num_attention_heads"] * cfg["head_dim"] * cfg["num_hidden_layers"]
    return attn / (attn + 2 * n * linear_weights(cfg))


def crossover(cfg):
    """Prompt length where the attention term equals the linear layers' FLOPs."""
    return linear_weights(cfg) / (2 * cfg["num_attention_heads"] * cfg["head_dim"] * cfg["num_hidden_layers"])


score_mib = tiny["num_attention_heads"] * 2048 ** 2 * 4 / 2**20
for name, cfg in (("tiny", tiny), ("Qwen3-0.6B", QWEN3_06B)):
    print(f"{name:10}: attention = linear FLOPs at n = {crossover(cfg):6.0f}; attention share at 512 / 2048: "
          f"{attention_share(cfg, 512):.0%} / {attention_share(cfg, 2048):.0%}")
print(f"tiny, 2048 tokens: the fp32 score matrix is {score_mib:.0f} MiB per layer")
growth = prefill_s[2048] / prefill_s[512]
flop_growth = prefill_cost(tiny, 2048, 4)[0] / prefill_cost(tiny, 512, 4)[0]
print(f"512 -> 2048 tokens: FLOPs {flop_growth:.1f}x, measured time {growth:.1f}x (linear would be 4x)")
assert crossover(tiny) < 512 < 2048 < crossover(QWEN3_06B)
assert attention_share(tiny, 2048) > 0.8 and attention_share(QWEN3_06B, 2048) < 0.5
assert growth > 4, "the tiny model's prefill grows faster than its token count: the n^2 term dominates"

# %% [markdown]
# 所以这台 CPU 上量到的 prefill 曲线，说的是 **tiny model 的 attention**：它的 $n^2$ 项在约 400 个 token 以后超过线性层，
# 2048 个 token 时占八成以上的运算，再加上分数矩阵的内存搬运。Qwen3-0.6B 的线性层大得多，要到约 3,800 个 token
# attention 才追上它们：在 GPU 上，常见长度的 prefill 时间主要是 GEMM，随 token 数近似线性，而且算力打满。
#
# ### 5.2 同样的问题，在 H100 上：课程记录的数字
#
# 下面读课程在 H100 上记录的两次运行（Qwen3-0.6B 形状，bf16，Triton/flash 内核，CUDA graphs；命令和机器见
# `docs/performance.md` 的 session 6 和 session 12），把它们放到上面的 roofline 上：

# %%
if RECORDED:
    prefill_tokens = prefill_rec["tokens"]
    prefill_ms = prefill_rec["forward_and_logits_ms"]
    achieved = 2 * prefill_tokens * linear_weights(QWEN3_06B) / (prefill_ms / 1e3)
    print(f"prefill 步：{prefill_rec['sequences']} 个 prompt、{prefill_tokens} 个 token，forward {prefill_ms:.1f} ms → "
          f"{prefill_ms / prefill_tokens * 1e3:.2f} us/token；仅线性层就是 {achieved / 1e12:.0f} TFLOP/s")
    kv_per_token = 2 * QWEN3_06B["num_hidden_layers"] * QWEN3_06B["num_key_value_heads"] * QWEN3_06B["head_dim"] * 2
    decode_rows = []
    for w in decode_rec["windows"]:
        attention_us = w["by_group_us"]["attention"]
        decode_rows.append((w["batch"], w["busy_us_per_step"], w["sum_context"] * kv_per_token / (attention_us / 1e6),
                            w["by_group_us"]["GEMM"]))
        print(f"decode 步，batch {w['batch']:3d}：GPU 忙 {w['busy_us_per_step'] / 1e3:5.2f} ms → "
              f"{w['busy_us_per_step'] / w['batch']:6.1f} us/token；attention 读 KV {decode_rows[-1][2] / 1e12:.2f} TB/s；"
              f"GEMM {w['by_group_us']['GEMM'] / 1e3:.2f} ms")
    big = max(decode_rows)
    small = min(decode_rows)
    prefill_us_per_token = prefill_ms / prefill_tokens * 1e3
    assert big[1] / big[0] > 5 * prefill_us_per_token, "a decode token costs several prefill tokens"
    assert all(bw > 0.9 * bandwidth for batch, _, bw, _ in decode_rows if batch >= 40), "decode reads at the bandwidth"
    assert achieved > 0.4 * peak_flops, "prefill runs at a large share of the GEMM rate"
    assert max(g for *_, g in decode_rows) < 1.25 * min(g for *_, g in decode_rows), "GEMM time barely follows the batch"
else:
    print("没有 docs/results/：GPU 的数字见课程仓库 docs/performance.md（session 6 的 prefill、session 12 的 decode 分段）")

# %% [markdown]
# 读数（上一格的断言保证，数字来自 H100 的记录，不是这台机器）：
#
# - 一个 prefill token 只要约 2.6 µs，线性层达到 GEMM 实测算力的一半以上：prefill 是 **compute-bound**。
# - decode 每个 token 要几十到一百多微秒；batch 40 以上时 attention 以 90% 以上的拷贝带宽读 KV cache，而 GEMM（读权重）
#   每步的时间几乎不随 batch 变：decode 是 **memory-bound**，每步的时间由 KV cache 的大小决定。
# - 所以长 prompt 的 prefill 会把同一步里所有 decode 请求拖住（第 2 节的 stalled，Tutorial 07 的 chunked prefill），
#   而 decode 要靠 batching 和 KV 的组织（Tutorial 03、04）。

# %% [markdown]
# ## 6. 端到端：第 1 讲的公式，和流式返回
#
# 第 1 讲写的是
#
# $$T_{\text{end-to-end}} = TTFT + N_{\text{out}} \cdot T_{\text{decode-step}} + T_{\text{stream}}$$
#
# 本节用的是
#
# $$T_{\text{e2e}} = TTFT + (N_{\text{out}} - 1) \cdot TPOT + T_{\text{stream}}$$
#
# 和讲义不同的两处，以及原因：
#
# - **$N_{\text{out}} - 1$ 而不是 $N_{\text{out}}$**：第一个 token 是 prefill 那一步采样出来的，已经算在 TTFT 里；之后每个 decode 步产生一个 token，
#   所以一个请求只经历 $N_{\text{out}} - 1$ 个 decode 步。讲义的写法把第一个 token 算了两次：$N_{\text{out}}$ 大时差一步无所谓，
#   $N_{\text{out}}=1$ 时根本没有 decode 步。下面从 log 数出 decode 步来核对。
# - **TPOT 代替 $T_{\text{decode-step}}$**：TPOT 是这个请求相邻 token 的平均间隔（vLLM 的定义，`reference.metrics`）。
#   只有当这个请求每一步都被调度、没被别人的 prefill 打断（第 2 节的 stalled）时，它才等于一个 decode 步的时间。
#
# 这里的 TTFT 从 **客户端** 调用 `LLM.stream` 算到客户端收到第一段输出，所以包括第 3 节缺的 $T_{\text{return}}$；
# $T_{\text{stream}}$ 是最后一个 token 采样出来之后，到客户端拿到最后一段文字为止（detokenize + 交给调用者）。
#
# 流式返回还有一个细节：byte-level tokenizer 会把一个汉字拆成几个 token，只收到一部分时解码出来是 `�`，
# `LLM.stream` 会把这一段 **扣住**，等字凑齐再发。

# %%
from reference.detokenizer import IncrementalDetokenizer

text = "你好，KV cache"
ids = tok.encode(text, add_special_tokens=False)
detok = IncrementalDetokenizer(tok)
deltas = [detok.push([t], finished=(k == len(ids) - 1)) for k, t in enumerate(ids)]
for t, d in zip(ids, deltas):
    print(f"token {t:5d} -> {tok.decode([t])!r:8} sent {d!r}")
assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)
assert "" in deltas, "a split character is held back at least once"

# %%
def streamed_request(llm, max_tokens):
    """One streamed request, timed at the client and in the engine's log."""
    start = len(llm.log.events)
    t_send = time.perf_counter()
    chunks = [(time.perf_counter(), chunk) for chunk in
              llm.stream([[5, 6, 7, 8] * 8], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))]
    evs = [e for e in llm.log.events[start:] if e["seq_id"] is not None]
    tokens = [e for e in evs if e["event"] in ("FIRST_TOKEN", "TOKEN")]
    first_chunk = next(t for t, c in chunks if c.token_ids)
    n_out = len(tokens)
    return {"n_out": n_out, "chunks": chunks,
            "decode_steps": sum(1 for e in evs if e["event"] == "SCHEDULED" and not e["is_prefill"]),
            "ttft": first_chunk - t_send, "t_return": first_chunk - tokens[0]["time"],
            "tpot": (tokens[-1]["time"] - tokens[0]["time"]) / (n_out - 1),
            "t_stream": chunks[-1][0] - tokens[-1]["time"], "e2e": chunks[-1][0] - t_send}


stream_llm = LLM(MODEL, device="auto")
streamed_request(stream_llm, 4)                                  # warm-up
run = streamed_request(stream_llm, 24)
print(f"N_out {run['n_out']}, decode steps in the log {run['decode_steps']}")
print(f"TTFT {run['ttft'] * 1e3:.2f} ms (T_return {run['t_return'] * 1e3:.3f} ms of it) + ({run['n_out']} - 1) x "
      f"TPOT {run['tpot'] * 1e3:.2f} ms + T_stream {run['t_stream'] * 1e3:.3f} ms; measured e2e {run['e2e'] * 1e3:.2f} ms")
chunks = [c for _, c in run["chunks"]]
print(f"{len(chunks)} chunks, text {sum(len(c.text) for c in chunks)} characters, "
      f"{sum(1 for c in chunks if c.text == '')} chunks held back")
assert run["decode_steps"] == run["n_out"] - 1, "the first token comes from prefill: N_out - 1 decode steps"
assert run["t_return"] >= 0 and run["t_stream"] >= 0
streamed = "".join(c.text for c in chunks)
assert streamed == tok.decode([t for c in chunks for t in c.token_ids], skip_special_tokens=True)
# tiny model 的输出是随机 token，其中有的字节本身就不是合法 UTF-8，最后解码出来也是 �；
# 扣住的只是 "还可能被后面的 token 补全" 的尾巴，所以拼起来的文字和一次解码全部 token 完全相同。

# %% [markdown]
# 这四项加起来等于 e2e 吗？如果四项都取自 **同一个请求** 的时间戳，相等是恒等式：TPOT 的定义就是
# $(t_{\text{FINISHED}} - t_{\text{FIRST\_TOKEN}}) / (N_{\text{out}} - 1)$，首尾相接的区间加起来当然等于总长，核对它什么也证明不了。
# 公式真正的用处是 **预测**：用一个短请求量出的 TTFT、TPOT、$T_{\text{stream}}$，预测同一个 prompt、输出长得多的请求的 e2e，再实测对照。
# 两种请求交替各跑 5 次，各取 e2e 最短的那一次（理由同第 5 节：机器忙只会让一次运行变慢）。

# %%
short_runs, long_runs = [], []
for _ in range(5):
    short_runs.append(streamed_request(stream_llm, 16))
    long_runs.append(streamed_request(stream_llm, 64))
short = min(short_runs, key=lambda r: r["e2e"])
measured = min(r["e2e"] for r in long_runs)
n_long = long_runs[0]["n_out"]
predicted = short["ttft"] + (n_long - 1) * short["tpot"] + short["t_stream"]
print(f"from the {short['n_out']}-token request: TTFT {short['ttft'] * 1e3:.2f} ms, TPOT {short['tpot'] * 1e3:.2f} ms, "
      f"T_stream {short['t_stream'] * 1e3:.3f} ms")
print(f"predicted e2e of the {n_long}-token request {predicted * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms "
      f"({predicted / measured - 1:+.0%})")
assert abs(predicted / measured - 1) < 0.3, "the formula predicts a longer request's e2e within 30%"

# %% [markdown]
# 预测在 30% 以内（上一格的断言）：一个单独运行的请求，decode 步的时间只随上下文变长而慢慢变大（tiny model 的 KV 很小；
# 预测通常偏低几个到十几个百分点，就是这一点），所以 16 个 token 量出的 TPOT 可以外推到 64 个 token。
# 两种情况下这个外推会失败，也正是第 1 讲的主线：
# 有别的请求在排队或 prefill 时（TTFT 里的 queue、TPOT 里的 stalled 步），以及 KV cache 大到读它成为 decode 的主要成本时（第 5 节）。

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** 从 `events` 找出所有被抢占过的请求：每次被抢占时释放了几个 block？被抢占时它已经生成了几个 token？
#
# **练习 2.** 被抢占的请求再次 prefill 时，`SCHEDULED` 事件里的 `num_new_tokens` 是多少？
# 为什么它比原来的 prompt 长？（提示：preemption by recompute。）
#
# ### 第 3 讲的课堂练习（讲义原文）
#
# 课堂练习可围绕请求时序图展开，以强化生命周期分析能力。
#
# - 标出至少 4 个潜在瓶颈点。
# - 标出至少 3 类状态对象的生成与释放时刻。
# - 讨论哪个阶段最可能支配 TTFT，哪个阶段最可能支配 TPOT。
#
# **练习一** 在时序图中标出：请求进入、prefill 开始、decode 开始、输出完成、状态释放五个节点。
#
# **练习二** 说明其中哪一个节点最适合插第一条日志，为什么。
#
# **练习三** 用一句话回答：为什么生命周期图是后续调度和 KV 讨论的公共前提？
#
# 用上面的 `events`（lifecycle log）和 `rows`（TTFT 分解）回答：每个结论都要指向 log 里的一个数字。

# %%
# 在这里写你的答案


# %% [markdown answer]
# ### 参考答案

# %% [answer]
for e in events:
    if e["event"] != "PREEMPTED":
        continue
    seq_id = e["seq_id"]
    tokens_before = sum(1 for x in events if x["seq_id"] == seq_id and x["event"] in ("FIRST_TOKEN", "TOKEN")
                        and x["step"] < e["step"])
    re_prefill = next(x for x in events if x["seq_id"] == seq_id and x["event"] == "SCHEDULED"
                      and x["step"] > e["step"])
    prompt_len = next(x["prompt_len"] for x in events if x["seq_id"] == seq_id and x["event"] == "ARRIVED")
    print(f"request {seq_id} preempted at step {e['step']}: freed {e['blocks_freed']} blocks after "
          f"{tokens_before} tokens; re-prefill computes {re_prefill['num_new_tokens']} tokens "
          f"(prompt {prompt_len} + {tokens_before} generated)")
    # recompute：已生成的 token 成了新 prompt 的一部分，它们的 KV 也要重算
    assert re_prefill["is_prefill"] and re_prefill["num_new_tokens"] == prompt_len + tokens_before

# %% [markdown answer]
# #### 第 3 讲：五个节点（练习一）
#
# 每个节点都是 log 里的一个事件：请求进入 = `ARRIVED`，prefill 开始 = 第一次 `SCHEDULED`（`is_prefill`），
# decode 开始 = 第一次 `is_prefill=False` 的 `SCHEDULED`，输出完成 = `FINISHED`，状态释放 = `FREED`（KV block 还给 block pool）。
# 被抢占过的请求在 `PREEMPTED` 时也释放一次状态，之后重新走 prefill。

# %% [answer]
NODES = [("请求进入", lambda e: e["event"] == "ARRIVED"),
         ("prefill 开始", lambda e: e["event"] == "SCHEDULED" and e["is_prefill"]),
         ("decode 开始", lambda e: e["event"] == "SCHEDULED" and not e["is_prefill"]),
         ("输出完成", lambda e: e["event"] == "FINISHED"),
         ("状态释放", lambda e: e["event"] == "FREED")]
for seq_id in (0, max(states)):                     # 最早的请求和最后到达的请求
    evs = [e for e in events if e["seq_id"] == seq_id]
    t0 = evs[0]["time"]
    nodes = [(name, next(e for e in evs if match(e))) for name, match in NODES]
    print(f"request {seq_id}: " + " -> ".join(f"{name} step {e['step']} (+{(e['time'] - t0) * 1e3:.1f} ms)"
                                               for name, e in nodes))
    steps = [e["step"] for _, e in nodes]
    assert steps == sorted(steps), "五个节点在 log 里按这个顺序出现"
    freed = nodes[-1][1]
    assert freed["blocks_freed"] > 0                 # 状态释放 = 这些 block 回到 pool

# %% [markdown answer]
# #### 瓶颈点与状态对象（讲义的三个问题）
#
# 下面的数字都来自这次运行的 log：

# %% [answer]
m_all = list(request_metrics(events).values())
queue_ms = [r[1] for r in rows]
stall_steps = sum(row.count("stalled") for row in states.values())
preempt_steps = sum(row.count("preempted") for row in states.values())
recomputed = sum(e["num_new_tokens"] for e in events if e["event"] == "SCHEDULED" and e["is_prefill"]) \
    - sum(len(p) for p, _ in requests)
kv_full_steps = sum(1 for e in events if e["event"] == "STEP" and e["kv_blocks_used"] == e["kv_blocks_total"])
print("潜在瓶颈点（各有一个数字）:")
print(f"  1. 排队（waiting 队列）：queue 最长 {max(queue_ms):.1f} ms，占该请求 TTFT 的 "
      f"{max(r[1] / r[4] for r in rows):.0%}")
print(f"  2. prefill-first 让 decode 停顿：所有请求合计 {stall_steps} 个 stalled 步")
print(f"  3. KV cache 满：{kv_full_steps} 步 block 全部用完")
print(f"  4. 抢占后重算：{preempt_steps} 个 preempted 步，多算了 {recomputed} 个 prefill token")
print("状态对象的生成与释放:")
first = next(e for e in events if e["event"] == "ARRIVED")
print(f"  Sequence：add_request 时生成（ARRIVED, step {first['step']}），FINISHED 后从 running 移出")
print(f"  KV block / block_table：第一次 SCHEDULED 时分配，PREEMPTED 或 FREED 时释放"
      f"（共释放 {sum(e['blocks_freed'] for e in events if e['event'] in ('FREED', 'PREEMPTED'))} 个 block，"
      f"被抢占的请求同一个位置释放两次）")
print(f"  输出 token（output_token_ids）：FIRST_TOKEN 时开始增长，随 Sequence 一起在完成后交回调用者")
assert stall_steps > 0 and preempt_steps > 0 and recomputed > 0

# %% [answer]
# 哪个阶段支配 TTFT、哪个支配 TPOT：量出来，而不是猜
queue_share = sum(r[1] for r in rows) / sum(r[4] for r in rows)
prefill_share = sum(r[3] for r in rows) / sum(r[4] for r in rows)
print(f"TTFT 总和里：queue {queue_share:.0%}，prefill {prefill_share:.0%}，其余是 schedule")
decode_steps = sum(row.count("decode") for row in states.values())
print(f"TPOT 由 decode 步决定：{decode_steps} 个 decode 步 + {stall_steps} 个 stalled 步（别的请求在 prefill）")
dominant = "queue" if queue_share > prefill_share else "prefill"
print(f"这次运行里 TTFT 的主导项是 {dominant}")
assert dominant == "queue", "下面的答案说 TTFT 主要是排队：数据变了，答案也要改"
assert queue_share + prefill_share <= 1 + 1e-9

# %% [markdown answer]
# 上面打印的主导项就是答案：资源紧、请求分批到达时，TTFT 主要是 **排队**（等 running 里的请求让出位置和 block），
# 不是 prefill 本身；TPOT 由 decode 步决定，而 prefill-first 调度插进来的 prefill 步（stalled）把它拉长。
#
# **练习二** 第一条日志插在 **请求进入**（`ARRIVED`）：TTFT、queue time、e2e 都从这一刻算起，
# 没有它就只剩"开始计算之后"的时间，上面占大头的排队时间完全看不见。
#
# **练习三** 因为调度决定的是"哪个请求在哪一步从一个阶段走到下一个阶段"，KV 管理决定的是"状态在哪个节点生成、在哪个节点释放"，
# 两者讨论的对象都是生命周期图上的节点和边。

