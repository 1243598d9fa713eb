# Tutorial 03 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: StaticBatching与ContinuousBatching

# %% [markdown]
# # Tutorial 03 · Static batching vs continuous batching
#
# **教学目标**
#
# 1. 在同一个引擎、同一批请求上，实现并测量两种 batching：
#    - **static batching**：请求按固定分组，一组跑完（等组里最长的请求结束）才放下一组进来；
#    - **continuous batching**：每一步都可以有请求离开、有新请求加入（iteration-level scheduling）。
# 2. 用 "每一步的 batch size" 图看懂 static batching 的空转：组里短的请求结束以后，它的位置一直空到整组结束。
# 3. 比较总步数、吞吐（output tokens/s）和每个请求的完成时间，并知道这个比较为什么是公平的。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 45 分钟
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 同一批请求 | 5 | 16 个请求，输出长度固定（确定） |
# | 2. 两种 batching | 10 | static 304 步、continuous 149 步（确定，断言 continuous 更少） |
# | 3. 每一步的 batch size | 10 | idle slot-steps 772 vs 152（确定） |
# | 4. 完成时间 | 5 | 图形：static 后几组的短请求完成得晚 |
# | 5. 交替重复 | 5 | 吞吐比、平均完成时间比的中位数 > 1（断言）；具体倍数随机器负载变（见过 1.6x，5 轮范围 1.2x–2.1x）；步数比 2.04x 是确定的 |
# | 课堂练习 | 10 | 输出长度相同时两边都是 64 步（确定，断言） |

# %%
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib.pyplot as plt
import numpy as np
import torch

from courseware.tiny_model import ensure_tiny_model
from reference import LLM, SamplingParams

MODEL = os.environ.get("INFERLAB_MODEL") or str(ensure_tiny_model())
if not torch.cuda.is_available():
    torch.set_num_threads(1)  # tiny model：单线程更快

# %% [markdown]
# ## 1. 同一批请求
#
# 16 个请求，prompt 长度 16–48，输出长度差别很大（大多数很短，少数很长），这是聊天服务里常见的形状。
# `ignore_eos=True` 让每个请求正好生成 `max_tokens` 个 token，两种方式做的工作完全一样。

# %%
BATCH = 4
rng = random.Random(0)
workload = []
for _ in range(16):
    prompt_len = rng.randint(16, 48)
    max_tokens = rng.choice([4, 8, 12, 16, 96])
    workload.append((prompt_len, max_tokens))
print("output lengths:", [m for _, m in workload])
print("total output tokens:", sum(m for _, m in workload))


def make_engine():
    # 每次运行用新引擎，并关掉 prefix caching：后跑的一方不能沾前一方缓存的光。
    return LLM(MODEL, device="auto", max_num_seqs=BATCH, enable_prefix_caching=False)


def make_requests(llm):
    vocab = llm.config.hf_config["vocab_size"]
    r = random.Random(1)
    return [([r.randrange(vocab - 3) for _ in range(n)], SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True))
            for n, m in workload]


make_engine().generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up

# %% [markdown]
# ## 2. 两种 batching，都建在公开 API 上
#
# 两个函数唯一的区别是 **什么时候把请求交给引擎**：
#
# - `run_static`：每次只 `add_request` 一组（`BATCH` 个），然后一直 `step()` 到这一组全部结束，才交下一组。
# - `run_continuous`：一开始就全部交给引擎，由调度器在每一步决定谁进 batch（`max_num_seqs=BATCH`）。
#
# 两种方式里所有请求都在 `t0` 时刻"到达"，完成时间都从 `t0` 量起。

# %%
def run_static(llm, requests, batch):
    t0 = time.perf_counter()
    done = {}
    for g in range(0, len(requests), batch):
        ids = {llm.add_request(p, sp): i for i, (p, sp) in enumerate(requests[g:g + batch], start=g)}
        while not llm.is_finished():    # 整组跑完才放下一组：组内最长的请求决定这组的时长
            llm.step()
        for seq_id, i in ids.items():
            done[i] = llm.finished.pop(seq_id)
    return t0, [done[i] for i in range(len(requests))]


def run_continuous(llm, requests):
    t0 = time.perf_counter()
    ids = [llm.add_request(p, sp) for p, sp in requests]
    while not llm.is_finished():
        llm.step()
    return t0, [llm.finished.pop(i) for i in ids]


def summarize_run(name, llm, t0, seqs):
    steps = [e for e in llm.log.events if e["event"] == "STEP"]
    wall = max(s.finished_time for s in seqs) - t0
    tokens = sum(s.num_output_tokens for s in seqs)
    return {
        "name": name, "steps": len(steps), "wall_s": wall, "tok_per_s": tokens / wall,
        "batch_sizes": [e["batch_size"] for e in steps],
        "finish_s": [s.finished_time - t0 for s in seqs],
        "ttft_s": [s.first_token_time - t0 for s in seqs],
        "slot_steps_idle": BATCH * len(steps) - sum(e["batch_size"] for e in steps),
    }


llm_s = make_engine()
static = summarize_run("static", llm_s, *run_static(llm_s, make_requests(llm_s), BATCH))
llm_c = make_engine()
continuous = summarize_run("continuous", llm_c, *run_continuous(llm_c, make_requests(llm_c)))

for r in (static, continuous):
    print(f"{r['name']:>10}: {r['steps']:4d} steps, {r['wall_s'] * 1e3:7.1f} ms, {r['tok_per_s']:7.0f} output tok/s, "
          f"mean finish {np.mean(r['finish_s']) * 1e3:6.1f} ms, idle slot-steps {r['slot_steps_idle']}")
assert continuous["steps"] < static["steps"]

# %% [markdown]
# ## 3. 每一步的 batch size
#
# static batching 的图是锯齿形：每组开始时 batch 是满的，短请求一个个结束后 batch 越来越小，
# 最后只剩那个 96 个 token 的长请求自己跑 —— 另外 3 个位置空转。continuous batching 一有位置空出来就补上新请求。
#
# continuous 图里那些窄的向下尖刺是 prefill 步：新请求加入的那一步只算新 prompt（prefill-first，见 Tutorial 02），
# 其他请求停一步。图的尾部 batch 也会变小：没有新请求可补时，continuous batching 也帮不上忙。

# %%
fig, axes = plt.subplots(2, 1, figsize=(7, 4.2), sharex=True, sharey=True)
for ax, r in zip(axes, (static, continuous)):
    ax.step(range(len(r["batch_sizes"])), r["batch_sizes"], where="post")
    ax.fill_between(range(len(r["batch_sizes"])), r["batch_sizes"], step="post", alpha=0.3)
    ax.axhline(BATCH, color="gray", linestyle=":", linewidth=1)
    ax.set_ylabel("batch size")
    ax.set_title(f"{r['name']} batching: {r['steps']} steps, {r['slot_steps_idle']} idle slot-steps")
axes[-1].set_xlabel("engine step")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. 每个请求什么时候结束
#
# 对用户来说，重要的是自己的请求什么时候完成。下图把每个请求的完成时间（从 `t0` 起）画出来：
# static batching 下，排在后面几组的短请求要先等前面整组跑完，所以完成得很晚。

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7, 3.2))
x = np.arange(len(workload))
ax1.bar(x - 0.2, np.array(static["finish_s"]) * 1e3, width=0.4, label="static")
ax1.bar(x + 0.2, np.array(continuous["finish_s"]) * 1e3, width=0.4, label="continuous")
ax1.set(xlabel="request (arrival order)", ylabel="finish time (ms from t0)", title="per-request finish time")
ax1.legend()
for r in (static, continuous):
    ax2.plot(np.sort(r["finish_s"]) * 1e3, np.arange(1, len(workload) + 1) / len(workload), marker=".", label=r["name"])
ax2.set(xlabel="finish time (ms from t0)", ylabel="fraction of requests done", title="CDF of finish time")
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. 时间的比值：交替重复，报中位数和范围
#
# 步数是确定的，跑一次就够；时间不是：同一台机器上，只跑一次的吞吐比在两次运行之间可以差很多（别的进程在抢 CPU），下面打印的范围就是这次的证据。
# 所以下面交替重复 `REPEATS` 轮（static、continuous，下一轮反过来），每轮算一个比值，报中位数和最小–最大值。
# 交替是为了让机器负载的慢变化平均地落在两边。

# %%
REPEATS = 5
ratios = {"throughput": [], "mean finish": []}
for r in range(REPEATS):
    order = ("static", "continuous") if r % 2 == 0 else ("continuous", "static")
    runs = {}
    for name in order:
        engine = make_engine()
        reqs = make_requests(engine)
        runs[name] = summarize_run(name, engine, *(run_static(engine, reqs, BATCH) if name == "static"
                                                   else run_continuous(engine, reqs)))
    ratios["throughput"].append(runs["continuous"]["tok_per_s"] / runs["static"]["tok_per_s"])
    ratios["mean finish"].append(np.mean(runs["static"]["finish_s"]) / np.mean(runs["continuous"]["finish_s"]))

print(f"steps: static/continuous = {static['steps'] / continuous['steps']:.2f}x (deterministic)")
for name, values in ratios.items():
    print(f"{name}: {'continuous/static' if name == 'throughput' else 'static/continuous'} = median "
          f"{np.median(values):.2f}x, range {min(values):.2f}x-{max(values):.2f}x over {REPEATS} alternating repeats")
# 断言中位数而不是每一轮：机器很忙时单独一轮可能接近 1x，这正是要重复的原因
assert np.median(ratios["throughput"]) > 1 and np.median(ratios["mean finish"]) > 1

# %% [markdown]
# **这个比较为什么公平？**
#
# - 同一个引擎、同一份代码，同样的 `max_num_seqs`；唯一的变量是请求交给引擎的时机。
# - 同样的请求（同一个种子生成），`ignore_eos=True` 固定了输出长度，两边做的 token 数完全一样。
# - 每次新建引擎、关掉 prefix caching，后跑的一方不会复用先跑一方的 KV；先做了 warm-up。
# - "步数" 是确定的（可重复、和机器无关）；"时间" 会随机器和负载抖动，两个都报。
#
# **我们的 static batching 其实还偏宽容**：组里结束的请求会离开 batch，不再参与计算。
# 经典的 static batching（例如把一批 prompt pad 成矩形交给 `model.generate`）里，结束的行还会继续算 padding，
# 浪费的不只是位置，还有算力。

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** 如果所有请求的输出长度都一样（比如都是 16），static 和 continuous 的步数还会差很多吗？先猜，再跑。
#
# **练习 2.** static batching 的总步数可以不跑引擎就算出来：写出公式，并和上面测到的 `static["steps"]` 对比。
# （提示：每组 1 步 prefill，之后的 decode 步数由组里最长的请求决定。）

# %%
# 在这里写你的答案


# %% [markdown answer]
# ### 参考答案

# %% [answer]
# 练习 2：每组 = 1 个 prefill 步 + (组内最大输出长度 - 1) 个 decode 步
predicted = sum(1 + max(m for _, m in workload[g:g + BATCH]) - 1 for g in range(0, len(workload), BATCH))
print("predicted static steps:", predicted, "measured:", static["steps"])
assert predicted == static["steps"]

# 练习 1：输出长度一样时，每组里的请求同时结束，static 没有空转，两者步数几乎相同
saved = workload
workload = [(n, 16) for n, _ in saved]
llm_s, llm_c = make_engine(), make_engine()
same_static = summarize_run("static", llm_s, *run_static(llm_s, make_requests(llm_s), BATCH))
same_cont = summarize_run("continuous", llm_c, *run_continuous(llm_c, make_requests(llm_c)))
workload = saved
print("equal lengths: static", same_static["steps"], "steps, continuous", same_cont["steps"], "steps")
assert same_static["steps"] == same_cont["steps"]
