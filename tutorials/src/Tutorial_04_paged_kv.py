# Tutorial 04 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: PagedKV与BlockManager

# %% [markdown]
# # Tutorial 04 · Paged KV cache 与 block manager
#
# **教学目标**
#
# 1. 一步一步看 `BlockManager` 怎样给请求分配 block：`allocate`、`may_append`、`deallocate`，block table 怎样增长，释放的 block 怎样被复用。
# 2. 在真实引擎里看 block table 随 decode 增长，以及一个 token 的 K/V 在 `kv_cache` 张量里的位置。
# 3. **测量** 连续预分配（每个请求预留 `max_model_len`）和分页分配在同样大小的 KV cache 上的差别：
#    显存利用率、能同时跑多少请求、总共要多少步。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 45 分钟
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. bookkeeping 的 block manager | 15 | block table 每一步的变化是确定的（固定输入） |
# | 2. 真实引擎里的 block table | 10 | 确定（断言） |
# | 3. 连续预分配 vs 分页 | 10 | 并发数、步数、利用率：步数和并发是确定的，利用率是 token 计数（确定） |
# | 课堂练习 | 10 | 见答案格子里的断言 |

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
from reference.engine.block_manager import BlockManager
from reference.engine.sequence import Sequence

MODEL = os.environ.get("INFERLAB_MODEL") or str(ensure_tiny_model())
if not torch.cuda.is_available():
    torch.set_num_threads(1)  # tiny model：单线程更快

# %% [markdown]
# ## 1. 只有 bookkeeping 的 block manager
#
# `BlockManager` 不碰任何张量：它只决定每个 token 的 K/V 放在哪个物理 block。所以可以脱离模型单独玩。
# 这里用一个 8 个 block、每个 block 4 个 token 的小池子，两个请求 A（6 个 token）和 B（9 个 token）。

# %%
BS = 4
bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
A = Sequence(list(range(100, 106)), SamplingParams(), BS, seq_id=0)
B = Sequence(list(range(200, 209)), SamplingParams(), BS, seq_id=1)
snapshots = []


def snapshot(title, seqs):
    owner = {}
    for seq in seqs:
        for logical, physical in enumerate(seq.block_table):
            owner[physical] = (seq.seq_id, logical)
    snapshots.append((title, owner))
    tables = ", ".join(f"{'AB'[s.seq_id] if s.seq_id < 2 else 'C'}: len={len(s)} table={s.block_table}" for s in seqs)
    print(f"{title:28} {tables} | free={list(bm.free_block_ids)}")


bm.allocate(A)
bm.allocate(B)
snapshot("prefill A, B", [A, B])

# A 继续 decode：每生成一个 token 就 append；新 token 落到新 block 的第一个位置时才需要新 block
for token in (106, 107, 108):
    A.append_token(token)
    before = len(A.block_table)
    bm.may_append(A)
    if len(A.block_table) > before:
        print(f"  A len {len(A)}: token at position {len(A) - 1} starts block {len(A.block_table) - 1} -> new block")
snapshot("A decodes 3 tokens", [A, B])

freed = bm.deallocate(B)
print(f"  B finished: {freed} blocks back to the free list")
snapshot("B finished", [A])

C = Sequence(list(range(300, 314)), SamplingParams(), BS, seq_id=2)
bm.allocate(C)
snapshot("C (14 tokens) arrives", [A, C])

# %%
def draw_pool(snapshots, num_blocks):
    fig, axes = plt.subplots(len(snapshots), 1, figsize=(7, 0.9 * len(snapshots) + 0.4))
    colors = {0: "#1f77b4", 1: "#ff7f0e", 2: "#2ca02c"}
    for ax, (title, owner) in zip(axes, snapshots):
        for b in range(num_blocks):
            seq_id, logical = owner.get(b, (None, None))
            ax.add_patch(plt.Rectangle((b, 0), 0.95, 1, color=colors.get(seq_id, "#eeeeee")))
            if seq_id is not None:
                ax.text(b + 0.47, 0.5, f"{'ABC'[seq_id]}{logical}", ha="center", va="center", color="white")
        ax.set_xlim(0, num_blocks)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_xticks(np.arange(num_blocks) + 0.47, [str(b) for b in range(num_blocks)])
        ax.set_ylabel(title, rotation=0, ha="right", va="center")
    axes[-1].set_xlabel("physical block id (label: request + logical block index)")
    plt.tight_layout()
    plt.show()


draw_pool(snapshots, 8)

# %% [markdown]
# 要点：
#
# - 一个请求的 block 在物理上 **不必连续**：C 拿到的是原来空闲的 6、7，再加上 B 刚释放的 4、3。
# - block table 只在需要时增长：A 从 6 个 token 长到 9 个 token，只在第 9 个 token（position 8）落到新 block 时才多要一个。
# - 浪费只发生在每个请求的最后一个 block 里，最多 `block_size - 1` 个位置。
# - 释放的 block 进入 free list 的末尾；分配从头部拿（最久之前释放的先被复用，Tutorial 05 会讲为什么这样对 prefix caching 有利）。

# %% [markdown]
# ## 2. 真实引擎里的 block table
#
# 用 `kvcache_block_size=8` 跑一个 13 个 token 的 prompt，生成 18 个 token。
# 每一步的 `SCHEDULED` 事件都记下了当时的 `block_table`。

# %%
llm = LLM(MODEL, device="auto", kvcache_block_size=8, num_kvcache_blocks=32, enable_prefix_caching=False)
prompt = list(range(10, 23))
llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=18, ignore_eos=True), use_tqdm=False)
last = None
for e in llm.log.events:
    if e["event"] == "SCHEDULED" and e["block_table"] != last:
        kv_len = e["num_cached_tokens"] + e["num_new_tokens"]
        phase = "prefill" if e["is_prefill"] else "decode "
        print(f"step {e['step']:2d} {phase}: K/V for tokens [0, {kv_len:2d}) -> block_table {e['block_table']}")
        last = e["block_table"]

# %% [markdown]
# 13 个 token 的 prompt 需要 2 个 block（8 + 5）。之后 position 16 和 24 的 token 各开一个新 block。
#
# ### K/V 在张量里的位置
#
# `llm.model_runner.kv_cache` 是一整块预先分配的张量，形状 `(2, layers, num_blocks, block_size, kv_heads, head_dim)`：
# 第 0 维是 K 和 V。token 在 position `p` 的 K 存在 `kv_cache[0, layer, block_table[p // block_size], p % block_size]`。

# %%
kv = getattr(llm.model_runner, "kv_cache", None)   # None: a lab 2 / lab 3 release runs a stand-in for lab 4
if kv is None:
    print("这个引擎的 model runner 没有分页的 kv_cache 张量：lab 2 / lab 3 的 release 用 lab 4 的 stand-in，"
          "每个请求一份自己的 dense KV。这一格在 lab 4 的 release 和课程仓库里运行。")
else:
    print("kv_cache shape:", tuple(kv.shape), kv.dtype)
    _, layers, num_blocks, block_size, kv_heads, head_dim = kv.shape
    bytes_per_token = 2 * layers * kv_heads * head_dim * kv.element_size()
    print(f"bytes per token = 2 (K,V) x {layers} layers x {kv_heads} kv_heads x {head_dim} head_dim x "
          f"{kv.element_size()} B = {bytes_per_token} B; per block: {bytes_per_token * block_size} B")

    table = last                       # the request's final block table (it is freed now, but its K/V are still there)
    stored = len(prompt) + 18 - 1      # the last sampled token is never fed back, so its K/V are never written
    filled = [bool(kv[0, 0, table[p // block_size], p % block_size].abs().sum() > 0) for p in range(len(table) * block_size)]
    print(f"slots holding K/V in this request's blocks: {sum(filled)} of {len(filled)} (expected {stored})")
    assert filled == [p < stored for p in range(len(filled))]

# %% [markdown]
# ## 3. 测量：连续预分配 vs 分页
#
# 没有分页时，引擎只能在请求开始时为它预留一段 **连续** 的空间，而且必须按最长可能长度（`max_model_len`）预留，
# 因为事先不知道它会生成多少 token。
#
# 我们不用模拟，直接用同一个引擎做这个实验：把 `kvcache_block_size` 设成 `max_model_len`，
# 每个请求就正好拿一个 `max_model_len` 大小的 block —— 这就是连续预分配。两边的 KV cache 总容量一样（1024 个 token）：
#
# | 配置 | block size | blocks | 容量 |
# | --- | --- | --- | --- |
# | contiguous | 256 (= `max_model_len`) | 4 | 1024 tokens |
# | paged | 16 | 64 | 1024 tokens |

# %%
MAX_LEN, CAPACITY = 256, 1024
rng = random.Random(0)
work = [(rng.randint(16, 64), rng.randint(16, 96)) for _ in range(24)]


def run(block_size):
    engine = LLM(MODEL, device="auto", max_model_len=MAX_LEN, kvcache_block_size=block_size,
                 num_kvcache_blocks=CAPACITY // block_size, max_num_seqs=64, enable_prefix_caching=False)
    vocab = engine.config.hf_config["vocab_size"]
    r = random.Random(1)
    prompts = [[r.randrange(vocab - 3) for _ in range(n)] for n, _ in work]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for _, m in work]
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    used = {}  # step -> tokens whose K/V are stored (summed over the sequences scheduled in a decode step)
    for e in engine.log.events:
        if e["event"] == "SCHEDULED" and not e["is_prefill"]:
            used[e["step"]] = used.get(e["step"], 0) + e["num_cached_tokens"] + e["num_new_tokens"]
    steps = [e for e in engine.log.events if e["event"] == "STEP"]
    decode = [e for e in steps if not e["is_prefill"]]
    return {
        "block_size": block_size, "wall_s": wall, "steps": len(steps), "outputs": outs,
        "decode_steps": [e["step"] for e in decode],
        "allocated": [e["kv_blocks_used"] * block_size for e in decode],
        "used": [used[e["step"]] for e in decode],
        "running": [e["num_running"] for e in steps],
        "preemptions": sum(e["event"] == "PREEMPTED" for e in engine.log.events),
    }


contiguous, paged = run(MAX_LEN), run(16)
assert [o["token_ids"] for o in contiguous["outputs"]] == [o["token_ids"] for o in paged["outputs"]]
for name, r in (("contiguous", contiguous), ("paged", paged)):
    util = np.sum(r["used"]) / np.sum(r["allocated"])
    print(f"{name:>10}: peak running {max(r['running']):2d}, {r['steps']:4d} steps, {r['wall_s'] * 1e3:6.0f} ms, "
          f"KV utilization {util:.0%}, preemptions {r['preemptions']}")
assert max(paged["running"]) > max(contiguous["running"])
assert paged["steps"] < contiguous["steps"]

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7, 3.4))
for r, color in ((contiguous, "#d62728"), (paged, "#1f77b4")):
    label = "contiguous" if r is contiguous else "paged"
    ax1.plot(r["decode_steps"], r["allocated"], color=color, label=f"{label}: allocated")
    ax1.plot(r["decode_steps"], r["used"], color=color, linestyle="--", label=f"{label}: used")
    ax2.plot(range(r["steps"]), r["running"], color=color, label=label)
ax1.axhline(CAPACITY, color="gray", linestyle=":", linewidth=1)
ax1.set(xlabel="engine step (decode steps)", ylabel="KV slots (tokens)", title="KV cache: allocated vs actually used")
ax1.legend(fontsize=8)
ax2.set(xlabel="engine step", ylabel="running requests", title="requests running at once")
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# 读图：
#
# - 连续预分配时，红色实线（已分配）一直贴着容量上限，但虚线（真正存了 K/V 的位置）只有它的一小部分：
#   每个请求实际最长 160 个 token，却占着 256 个位置，而且刚开始时只用了几十个。
# - 分页时，分配量紧跟实际用量（差距只在每个请求的最后一个 block 里），同样的显存能同时跑多几倍的请求，总步数少得多。
# - 代价是 **超售**：分页按需分配，KV 可能在中途用完，这时要 preempt（上面的 `preemptions`）；连续预分配永远不会。
#   真实系统里 `max_model_len` 往往是几千甚至几万，连续预分配的浪费比这里大得多。

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** `block_size=16` 时，prompt 长度为 15、16、17 的请求 prefill 各需要几个 block？
# 各自在生成第几个 token 之后第一次调用 `may_append` 真的加了一个 block？先算，再用 `BlockManager` 验证。
#
# **练习 2.** 如果 `max_model_len` 是默认的 4096，上面这批请求在连续预分配下的 KV 利用率大约是多少？
# 1024 个 token 的 KV cache 能同时放几个请求？

# %%
# 在这里写你的答案


# %% [markdown answer]
# ### 参考答案

# %% [answer]
def first_new_block(prompt_len, block_size=16):
    """Output token count after which may_append first adds a block."""
    manager = BlockManager(num_blocks=8, block_size=block_size, enable_prefix_caching=False)
    seq = Sequence(list(range(prompt_len)), SamplingParams(), block_size, seq_id=0)
    manager.allocate(seq)
    prefill_blocks = len(seq.block_table)
    n = 0
    while True:
        seq.append_token(0)   # the sampled token; the next decode step stores its K/V
        n += 1
        before = len(seq.block_table)
        manager.may_append(seq)
        if len(seq.block_table) > before:
            return prefill_blocks, n


for p in (15, 16, 17):
    blocks, n = first_new_block(p)
    print(f"prompt {p}: prefill uses {blocks} block(s); the first new block comes after output token {n}")
    # 新 block 在 position 为 16 的倍数的 token 需要存 K/V 时出现
    assert blocks == -(-p // 16) and p + n - 1 == blocks * 16

lengths = [n + m for n, m in work]
print(f"max_model_len=4096: utilization at the end of each request ~ {np.mean(lengths) / 4096:.1%}, "
      f"requests that fit in 1024 tokens: {1024 // 4096} -> not even one")
