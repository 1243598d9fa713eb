# Tutorial 05 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: PrefixCaching

# %% [markdown]
# # Tutorial 05 · Prefix caching
#
# **教学目标**
#
# 1. 理解 block 的 **hash chain**：一个满 block 的 hash 由它自己的 token 和前一个 block 的 hash 一起决定，所以 hash 相等 ⇔ 整个前缀相等。
# 2. 在多轮对话里测量 prefix cache 的命中：每一轮有多少 prompt token 不用重算，hit rate 是多少，prefill 的计算量省了多少。
# 3. 看清几条规则：只有算完 K/V 的满 block 才能被共享；同一步里一起 prefill 的请求互相命中不了；最后一个 prompt token 永远要重算。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 45 分钟
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. Hash chain | 10 | 确定（断言） |
# | 2. 多轮对话命中率 | 10 | 每一轮的命中 token 数是确定的（断言） |
# | 3. 共享 system prompt | 10 | 同一步里互相命中不了（断言） |
# | 4. cache 还在 | 5 | 确定（断言） |
# | 课堂练习 | 10 | 见答案格子里的断言 |

# %%
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib.pyplot as plt
import numpy as np
import torch

from courseware.tiny_model import ensure_tiny_model
from reference import LLM, SamplingParams
from reference.engine.block_manager import chain_hash

MODEL = os.environ.get("INFERLAB_MODEL") or str(ensure_tiny_model())
if not torch.cuda.is_available():
    torch.set_num_threads(1)  # tiny model：单线程更快

# %% [markdown]
# ## 1. Hash chain
#
# `chain_hash(tokens, prev_hash)` 是 block manager 用的函数（xxhash64）。把一个 prompt 切成 block，依次算：

# %%
BS = 4
tokens = list(range(1, 15))          # 14 tokens: 3 full blocks + 2 tokens
changed = list(tokens)
changed[5] = 999                     # one token in block 1


def hashes(token_ids, block_size=BS):
    out, prev = [], None
    for i in range(len(token_ids) // block_size):  # only full blocks get a hash
        prev = chain_hash(token_ids[i * block_size:(i + 1) * block_size], prev)
        out.append(prev)
    return out


for i, (h1, h2) in enumerate(zip(hashes(tokens), hashes(changed))):
    print(f"block {i}: {h1:016x}  {h2:016x}  {'same' if h1 == h2 else 'DIFFERENT'}")
assert hashes(tokens)[0] == hashes(changed)[0] and hashes(tokens)[2] != hashes(changed)[2]

# %% [markdown]
# 只改了 block 1 里的一个 token，block 2 的 token 完全没变，但它的 hash 也变了：因为 hash 是 **链** 起来的。
# 所以查表时只要看 hash 就知道 "这个 block 以及它之前的所有 token" 都一样 —— 这正是 K/V 可以复用的条件
# （一个 token 的 K/V 依赖于它之前的所有 token）。最后 2 个 token 不满一个 block，没有 hash，不能被共享。

# %% [markdown]
# ## 2. 多轮对话：每一轮命中多少？
#
# 一个 system prompt + 5 轮对话。每一轮的 prompt 都是 **整段历史** 套上 chat template。
# 同样的对话分别在 `enable_prefix_caching=True` 和 `False` 的引擎上跑，从 lifecycle log 读出每一轮第一次 `SCHEDULED` 时的 `num_cached_tokens`。

# %%
SYSTEM = ("You are a patient tutor who explains LLM inference step by step. Answer in short sentences, "
          "use the words prefill, decode, KV cache and block table where they fit, and give one example.")
QUESTIONS = ["What is the KV cache?", "为什么 decode 比 prefill 慢？", "What does a block table store?",
             "Explain prefix caching.", "How does chunked prefill help?"]


def chat(enable_prefix_caching):
    llm = LLM(MODEL, device="auto", enable_prefix_caching=enable_prefix_caching, kvcache_block_size=16)
    messages = [{"role": "system", "content": SYSTEM}]
    turns = []
    for q in QUESTIONS:
        messages.append({"role": "user", "content": q})
        prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        n_events = len(llm.log.events)
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)[0]
        new = llm.log.events[n_events:]
        sched = next(e for e in new if e["event"] == "SCHEDULED")
        arrived = next(e for e in new if e["event"] == "ARRIVED")
        first = next(e for e in new if e["event"] == "FIRST_TOKEN")
        turns.append({"prompt_len": arrived["prompt_len"], "cached": sched["num_cached_tokens"],
                      "computed": sched["num_new_tokens"], "ttft_ms": (first["time"] - arrived["time"]) * 1e3,
                      "same_ids_after_retokenize": llm.tokenize(out["text"]) == out["token_ids"]})
        messages.append({"role": "assistant", "content": out["text"]})
    return llm, turns


chat(True)  # warm-up (first forward passes are slower)
llm_on, with_cache = chat(True)
_, without_cache = chat(False)
print("turn  prompt  cached  computed  hit rate   | no cache: computed")
for i, (a, b) in enumerate(zip(with_cache, without_cache), start=1):
    print(f"{i:4d}  {a['prompt_len']:6d}  {a['cached']:6d}  {a['computed']:8d}  {a['cached'] / a['prompt_len']:8.0%}   "
          f"| {b['computed']:8d}")
total_hit = sum(t["cached"] for t in with_cache) / sum(t["prompt_len"] for t in with_cache)
print(f"overall hit rate: {total_hit:.0%}")
assert all(t["cached"] == 0 for t in without_cache)
assert all(t["cached"] > 0 for t in with_cache[1:])

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7, 3.2))
turn = np.arange(1, len(QUESTIONS) + 1)
ax1.bar(turn - 0.2, [t["computed"] for t in without_cache], width=0.4, color="#d62728", label="no cache: computed")
ax1.bar(turn + 0.2, [t["computed"] for t in with_cache], width=0.4, color="#1f77b4", label="cache: computed")
ax1.bar(turn + 0.2, [t["cached"] for t in with_cache], width=0.4, bottom=[t["computed"] for t in with_cache],
        color="#aec7e8", label="cache: hit (not computed)")
ax1.set(xlabel="turn", ylabel="prompt tokens", title="prefill work per turn")
ax1.legend(fontsize=8)
ax2.plot(turn, [t["ttft_ms"] for t in without_cache], marker="o", color="#d62728", label="no cache")
ax2.plot(turn, [t["ttft_ms"] for t in with_cache], marker="o", color="#1f77b4", label="prefix cache")
ax2.set(xlabel="turn", ylabel="TTFT (ms)", title="TTFT per turn", ylim=(0, None), xticks=turn)
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# - 第 1 轮没有可以命中的东西（cache 是空的）；从第 2 轮开始，上一轮的整个 prompt（system + 历史）基本都命中了，
#   只需要算新加的部分。对话越长，hit rate 越高，没有 cache 时的 prefill 工作量却越来越大。
# - 命中的粒度是 block（这里 16 个 token）：不满一个 block 的尾巴，以及上一轮回答之后的内容，都要重算。
# - 注意：我们把上一轮回答的 **文本** 放回历史，再重新 tokenize。文本再编码得到的 token 不一定和当初生成的 token 一样
#   （byte-level BPE 的合并方式可能不同），所以命中的边界通常停在上一轮的 prompt 末尾附近。
# - 左图的 token 数是确定的；右图的 TTFT 是测出来的，会随机器和负载抖动。prompt 越长，省下的 prefill 越多，
#   在 GPU 上跑真实模型、历史有几千个 token 时，这部分就是 TTFT 的大头。

# %%
print("does re-tokenizing each answer's text give back the generated ids?",
      [t["same_ids_after_retokenize"] for t in with_cache])

# %% [markdown]
# ## 3. 共享 system prompt 的多个用户；同一步里互相命中不了
#
# 8 个用户用同一个 system prompt、问不同的问题。分两种提交方式：
#
# - **一起到达**：8 个请求在同一个 prefill 步里算。block 只有在 K/V 算完之后（`mark_computed`）才有 hash，
#   所以同一步里的请求彼此命中不了，每个都完整地算一遍 system prompt。
# - **先来一个**：第一个用户先跑一步，之后的 7 个就能命中它的 system prompt block。

# %%
users = [f"User {i} asks: what is block {i} used for?" for i in range(8)]


def shared_prompt_run(first_alone):
    llm = LLM(MODEL, device="auto", kvcache_block_size=16)
    prompts = [llm.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}],
                                                 add_generation_prompt=True, tokenize=False) for u in users]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    if first_alone:
        llm.add_request(prompts[0], params)
        llm.step()                      # the first user's prefill: its full blocks get hashes now
        rest = prompts[1:]
    else:
        rest = prompts
    ids = [llm.add_request(p, params) for p in rest]
    llm.step()                          # the prefill step of the others
    shared = llm.sequences[ids[-1]].block_table[0]
    ref_count = llm.block_manager.blocks[shared].ref_count
    while not llm.is_finished():
        llm.step()
    cached = [e["num_cached_tokens"] for e in llm.log.events if e["event"] == "SCHEDULED" and e["is_prefill"]]
    return cached, ref_count


together, rc_together = shared_prompt_run(first_alone=False)
staggered, rc_staggered = shared_prompt_run(first_alone=True)
print("all at once  : cached tokens per request", together, "| ref_count of block 0:", rc_together)
print("first, then 7: cached tokens per request", staggered, "| ref_count of block 0:", rc_staggered)
assert sum(together) == 0 and all(c > 0 for c in staggered[1:])
assert rc_together == 1 and rc_staggered == len(users)

# %% [markdown]
# 一起到达时每个请求的 block 0 都是自己的（`ref_count == 1`）；先来一个时，8 个请求共享同一个物理 block（`ref_count == 8`）。
# 真实系统（如 vLLM）也有这个现象：同时到达的相同前缀，第一批要各算各的。
#
# ## 4. 请求结束以后，cache 还在
#
# 请求结束时 block 回到 free list，但 **保留 hash 和内容**，直到这个 block 被分配给别人才失效。
# 所以稍后到达的相同前缀还能命中（free list 先发出最久以前释放的 block，刚释放的前缀留得最久）。
# 一个完全相同的 prompt 也不会 100% 命中：最后一个 token 必须重算，否则这一步就没有 query 可以采样。

# %%
llm = LLM(MODEL, device="auto", kvcache_block_size=16)
prompt = list(range(1, 65))                      # 64 tokens = exactly 4 blocks
llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
print("blocks in use after the request finished:", llm.block_manager.num_used_blocks,
      "| cached hashes:", len(llm.block_manager.hash_to_block))
n = len(llm.log.events)
llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
sched = next(e for e in llm.log.events[n:] if e["event"] == "SCHEDULED")
print(f"same 64-token prompt again: cached {sched['num_cached_tokens']}, computed {sched['num_new_tokens']}")
assert sched["num_cached_tokens"] == 48 and sched["num_new_tokens"] == 16

# %% [markdown]
# 64 个 token 正好 4 个 block：前 3 个 block 命中，第 4 个 block 里有最后一个 token，整个 block 重算（16 个 token）。
#
# ## 课堂练习
#
# **练习 1.** 把第 2 节对话里的 system prompt 改成放在 **最后一条** 用户消息里（即每轮把说明文字附在问题后面）。
# 你预计 hit rate 会怎样变化？为什么？
#
# **练习 2.** 第 4 节里，如果 prompt 是 65 个 token，第二次运行会命中多少个 token、计算多少个？先算，再验证。

# %%
# 在这里写你的答案


# %% [markdown answer]
# ### 参考答案

# %% [answer]
# 练习 2：65 个 token -> 前 64 个（4 个满 block）都不含最后一个 token，全部命中，只算 1 个 token
llm = LLM(MODEL, device="auto", kvcache_block_size=16)
prompt65 = list(range(1, 66))
llm.generate([prompt65], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
n = len(llm.log.events)
llm.generate([prompt65], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
sched = next(e for e in llm.log.events[n:] if e["event"] == "SCHEDULED")
print(f"65-token prompt again: cached {sched['num_cached_tokens']}, computed {sched['num_new_tokens']}")
assert (sched["num_cached_tokens"], sched["num_new_tokens"]) == (64, 1)

# 练习 1：说明文字放在最后一条消息里，它之后的内容每轮都不同，而它本身也在变的位置上；
# 前缀里只剩历史消息可以命中。历史在变长，hit rate 仍然不低，但每轮都要多算一遍说明文字。
# 规律：把不变的内容（system prompt、工具说明、文档）放在 prompt 的最前面。
QUESTIONS_SAVED, SYSTEM_SAVED = QUESTIONS, SYSTEM
QUESTIONS = [q + " " + SYSTEM_SAVED for q in QUESTIONS_SAVED]
SYSTEM = "You are helpful."
_, moved = chat(True)
QUESTIONS, SYSTEM = QUESTIONS_SAVED, SYSTEM_SAVED
moved_hit = sum(t["cached"] for t in moved) / sum(t["prompt_len"] for t in moved)
moved_computed = sum(t["computed"] for t in moved)
print(f"instructions at the end: hit rate {moved_hit:.0%}, computed {moved_computed} tokens "
      f"(instructions first: {total_hit:.0%}, computed {sum(t['computed'] for t in with_cache)} tokens)")
assert moved_computed > sum(t["computed"] for t in with_cache)
