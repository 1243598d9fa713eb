# Tutorial 02 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: 请求生命周期与PrefillDecode

# %% [markdown]
# # Tutorial 02 · 请求生命周期：Prefill 与 Decode
#
# **教学目标**
#
# 1. 说出一个请求在引擎里经过的状态：queued → prefill → decode → finished，以及 preempted（被抢占后重新排队）。
# 2. 从 lifecycle log 画出每个请求的时间线（timeline），看懂 prefill-first 调度下 decode 为什么会"停顿"。
# 3. 把 TTFT 拆成三段：**queue**（排队）+ **schedule**（调度开销）+ **prefill**（前向计算、采样、后处理），并验证三段之和正好等于 TTFT。
# 4. 看 chat template 如何把一句很短的话变成长得多的 prompt。
# 5. 量出 prefill（compute-bound）和 decode（memory-bound）每一步的时间怎样随 token 数、batch 变化。
# 6. 用真实运行验证 T_e2e = TTFT + (N_out − 1)·TPOT + T_stream，看流式返回如何扣住被拆开的汉字。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 75 分钟，对应第 3 讲
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 小场景 | 10 | 191 步、8 个请求、7 次抢占（确定：固定种子、`ignore_eos`） |
# | 2. 时间线 | 15 | stalled 8 步、preempted 157 步（确定） |
# | 3. TTFT 分解 | 10 | 三段之和 = TTFT（断言，误差 < 1 µs）；毫秒数随机器变 |
# | 4. chat template | 5 | token 数严格递增（断言） |
# | 5. prefill vs decode | 10 | 16 倍 token：prefill 步的时间涨幅超过 decode 步的两倍（断言）；具体倍数随机器和引擎变 |
# | 6. 端到端公式与流式返回 | 5 | 四项之和 = 客户端 e2e（断言）；"好" 被拆成 3 个 token，扣住 2 次（确定） |
# | 课堂练习 + 第 3 讲练习 | 20 | TTFT 总和中 queue 占 93%–94%、prefill 6%–7%（2 次运行）；多算的 prefill token 304（确定） |
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
fig, ax = plt.subplots(figsize=(11, 3.6))
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
# ## 3. TTFT = queue + schedule + prefill
#
# 对每个请求（时间都来自 `time.perf_counter()`，和 log 用的是同一个时钟）：
#
# - **queue** = 它第一次被调度的那一步开始调度的时刻 − `ARRIVED`
# - **schedule** = 那一步 `ModelRunner.run` 开始的时刻 − 调度开始的时刻（`Scheduler.schedule` 和 log 的开销）
# - **prefill** = `FIRST_TOKEN` − `ModelRunner.run` 开始（前向计算、采样、后处理）
#
# 三段首尾相接，所以和一定等于 `FIRST_TOKEN − ARRIVED`，也就是 `reference.metrics` 算出的 TTFT。

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
fig, (ax, ax_pct) = plt.subplots(1, 2, figsize=(11, 3.2))
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
# ## 5. Prefill 是 compute-bound，decode 是 memory-bound：在这台机器上量
#
# 讲义说 prefill "计算密集"、decode "显存带宽敏感"。不用猜，量每一步的时间。这一节固定在 **CPU** 上量：
# tiny model 在 GPU 上太小，1024 个 token 的 prefill 也只是几十个 kernel launch，每一步的时间几乎都是固定开销，
# 看不出两者的区别（在 H100 上量过：prefill 1024 和 64 个 token 一样快）。Qwen3-0.6B 大小的模型在 H100 上每一步的时间
# 随 decode batch 怎样变，课程仓库的 `docs/performance.md` 有实测（bench-256 按 batch 分段）。
#
# - prefill：一个请求，prompt 从 32 到 2048 个 token，量 prefill 那一步（比较 128 → 2048：prompt 再短，一步的时间几乎全是
#   调度、采样这些固定开销，看不出 token 数的作用；CPU 上的 lab 1–3 release 用 transformers 的 forward 代替 lab 4 的
#   model runner，它的 prefill 更快，128 个 token 的一步更是几乎只剩固定开销）；
# - decode：batch 里 1 到 16 个请求，量 decode 步。
#
# 每个点量 5 次取最小值：别的进程抢 CPU 只会让一次测量变慢、不会变快，所以最小值最接近这台机器本来的速度
# （一步里的几个 decode 步仍取中位数）。5 轮交错着量（每轮把所有点各量一次）：机器忙的那几秒只拖慢一轮，
# 而不是某一个点的全部 5 次。如果 prefill 是 compute-bound，它的时间应该随 token 数近似线性增长；
# 如果 decode 受 "每一步都要把全部权重读一遍"（以及固定开销）限制，它的时间几乎不随 batch 增长：每个 token 的成本随 batch 下降。

# %%
import numpy as np


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

fig, ax = plt.subplots(figsize=(7, 3.4))
ax.loglog(PREFILL_TOKENS, [prefill_s[n] / n * 1e6 for n in PREFILL_TOKENS], "o-", color="#d62728", label="prefill (1 request)")
ax.loglog(DECODE_BATCH, [decode_s[b] / b * 1e6 for b in DECODE_BATCH], "s-", color="#1f77b4", label="decode (batch)")
ax.set(xlabel="tokens computed in the step", ylabel="us per token", title="cost per token (tiny model, CPU)")
ax.legend()
plt.tight_layout()
plt.show()

prefill_growth = prefill_s[2048] / prefill_s[128]         # 16x tokens
decode_growth = decode_s[16] / decode_s[1]                # 16x tokens
print(f"16x tokens: prefill step {prefill_growth:.1f}x longer, decode step {decode_growth:.1f}x longer")
assert prefill_growth > 2 * decode_growth, "prefill time follows the tokens; decode time barely follows the batch"

# %% [markdown]
# 读图（上一格的断言保证）：decode 每个 token 的成本随 batch 变大而下降得快 —— 一步的时间主要是把权重读一遍和固定开销，
# 多几个请求几乎不要钱，所以 decode 要靠 **batching** 提高效率（Tutorial 03）。prefill 一步里 token 已经很多，
# 时间随 token 数增长，再加 token 就是再加计算（course engine 在 CPU 上到 2048 个 token 时涨得比线性还快：tiny model 的
# hidden 只有 64，attention 里随 token 数平方增长的那一项占了大头）—— 所以长 prompt 的 prefill 会把同一步里所有 decode 请求拖住（Tutorial 02 第 2 节的 stalled，
# Tutorial 07 的 chunked prefill）。tiny model 在 CPU 上数字很小，形状和 GPU 上的大模型一样。

# %% [markdown]
# ## 6. 端到端：T_e2e = TTFT + (N_out − 1)·TPOT + T_stream，和流式返回
#
# 第 1 讲的公式，用 `LLM.stream` 在 **客户端** 量一次：
#
# - TTFT：从调用 `stream` 到 `FIRST_TOKEN`（log）；TPOT：`FIRST_TOKEN` 到最后一个 token 的平均间隔（log）；
# - T_stream：最后一个 token 采样出来之后，到客户端拿到最后一段文字为止（detokenize + 交给调用者）。
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
stream_llm = LLM(MODEL, device="auto")
t_send = time.perf_counter()
chunks = []
for chunk in stream_llm.stream([[5, 6, 7, 8] * 8], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)):
    chunks.append((time.perf_counter(), chunk))
t_last = chunks[-1][0]
evs = [e for e in stream_llm.log.events if e["seq_id"] is not None]
tokens = [e for e in evs if e["event"] in ("FIRST_TOKEN", "TOKEN")]
n_out = len(tokens)
ttft = tokens[0]["time"] - t_send
tpot = (tokens[-1]["time"] - tokens[0]["time"]) / (n_out - 1)
t_stream = t_last - tokens[-1]["time"]
e2e = t_last - t_send
print(f"TTFT {ttft * 1e3:.2f} ms + ({n_out} - 1) x TPOT {tpot * 1e3:.2f} ms + T_stream {t_stream * 1e3:.3f} ms "
      f"= {(ttft + (n_out - 1) * tpot + t_stream) * 1e3:.2f} ms; measured e2e {e2e * 1e3:.2f} ms")
print(f"{len(chunks)} chunks, text {sum(len(c.text) for _, c in chunks)} characters, "
      f"{sum(1 for _, c in chunks if c.text == '')} chunks held back")
assert abs(ttft + (n_out - 1) * tpot + t_stream - e2e) < 1e-9
streamed = "".join(c.text for _, c in chunks)
token_ids = [t for _, c in chunks for t in c.token_ids]
assert t_stream >= 0 and streamed == tok.decode(token_ids, skip_special_tokens=True)
# tiny model 的输出是随机 token，其中有的字节本身就不是合法 UTF-8，最后解码出来也是 �；
# 扣住的只是 "还可能被后面的 token 补全" 的尾巴，所以拼起来的文字和一次解码全部 token 完全相同。

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

