# Tutorial 07 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: ModelRunner与执行路径

# %% [markdown]
# # Tutorial 07 · Model runner 与执行路径
#
# **教学目标**
#
# 1. 看懂 `ModelRunner.prepare_prefill` / `prepare_decode` 每一步真正交给模型的输入张量：
#    扁平的 `input_ids`、`positions`，`cu_seqlens_q/k`，`slot_mapping`，`block_tables`，`context_lens`。
# 2. 会用公式 `slot = block_table[p // block_size] * block_size + p % block_size` 从 block table 算出 slot，并在 `kv_cache` 里找到写进去的 K/V。
# 3. 看 prefix 命中和 chunked prefill 时 `cu_seqlens_q` 和 `cu_seqlens_k` 为什么不同。
# 4. 用 Hugging Face `transformers` 的稠密实现当 oracle，验证分页执行路径算出的 token 完全一样。
# 5. 有 GPU 时：看 CUDA graphs 和 Triton kernel 带来的差别；没有 GPU 时，知道那里会跑什么。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 75 分钟
#
# 下表每个数字都有格子里的断言（括号里是断言的界）。
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 输入张量 | 15 | `slot_mapping`、`block_tables` 是确定的（断言） |
# | 2. kv_cache 的内容 | 10 | 确定（断言） |
# | 3. cu_seqlens_q ≠ cu_seqlens_k | 10 | 确定（断言） |
# | 3.1 chunked prefill 与 ITL / TTFT | 15 | step 数确定：decode 最长 ITL whole 2 步、chunked 5 步、interleaved 2 步；长 prompt 的 TTFT interleaved 比 chunked 多 3 步（断言）；interleaved 的 ITL 毫秒数 < whole 的 3/4（断言）；其余毫秒数随机器变，CPU 上 whole 的 TTFT 反而最长（讲 tiny model 的 n² 项）；H100 估算：ITL 降到一半以下、TTFT 涨到两倍以上（断言，由记录算出，确定） |
# | 4. 对照稠密实现 | 5 | tiny model fp32 下 token 完全相同（断言） |
# | 5. GPU | 10 | 有 GPU 时实测；CPU 上读 H100 的记录：CUDA graphs 把 16k token prefill 步的 launch CPU 时间从 34.5 ms 降到 5.6 ms、GPU 时间不变（断言：< 1/4、差 < 5%）；decode 步 CPU 工作是 graph replay 的 20%–50%（断言）；bench-256 异步 / 同步 1.35 倍（断言：1.25–1.45） |
# | 课堂练习 | 10 | 见答案格子里的断言 |

# %%
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from courseware.tiny_model import ensure_tiny_model
from reference import LLM, SamplingParams

MODEL = os.environ.get("INFERLAB_MODEL") or str(ensure_tiny_model())
if not torch.cuda.is_available():
    torch.set_num_threads(1)  # tiny model：单线程更快

# %% [markdown]
# ## 1. 截下每一步的输入张量
#
# 不改引擎代码：把 `prepare_prefill` / `prepare_decode` 包一层，原样返回结果，同时把结果存下来。
# 三个 prompt，长度 5、11、19，`kvcache_block_size=8`，各生成 3 个 token。

# %%
def record_inputs(llm):
    captured = []
    runner = llm.model_runner
    for name in ("prepare_prefill", "prepare_decode"):
        original = getattr(runner, name)

        def wrapper(seqs, _original=original, _name=name):
            input_ids, positions, meta = _original(seqs)
            captured.append({"phase": _name.split("_")[1], "input_ids": input_ids.cpu(), "positions": positions.cpu(),
                             "meta": meta, "block_table_lists": [list(s.block_table) for s in seqs],
                             "seq_lens": [len(s) for s in seqs]})
            return input_ids, positions, meta

        setattr(runner, name, wrapper)
    return captured


def show(step):
    meta = step["meta"]
    print(f"--- {step['phase']} ---")
    print("input_ids     ", step["input_ids"].tolist())
    print("positions     ", step["positions"].tolist())
    if meta.cu_seqlens_q is not None:
        print("cu_seqlens_q  ", meta.cu_seqlens_q.tolist())
        print("cu_seqlens_k  ", meta.cu_seqlens_k.tolist())
    print("slot_mapping  ", meta.slot_mapping.tolist())
    print("block_tables  ", meta.block_tables.tolist())
    print("context_lens  ", meta.context_lens.tolist())


BS = 8
llm = LLM(MODEL, device="auto", kvcache_block_size=BS, num_kvcache_blocks=32, enable_prefix_caching=False)
captured = record_inputs(llm)
prompts = [list(range(100, 105)), list(range(200, 211)), list(range(300, 319))]
outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False)
print(f"{len(captured)} steps captured: {[c['phase'] for c in captured]}")
show(captured[0])

# %% [markdown]
# 读 prefill 的张量：
#
# - 三个请求的 token **首尾相接** 成一个扁平的 `input_ids`（5 + 11 + 19 = 35 个），没有 padding。
# - `cu_seqlens_q` 是前缀和 `[0, 5, 16, 35]`：第 i 个请求的 token 在 `input_ids[cu[i]:cu[i+1]]`。attention 靠它知道每个 query 属于谁。
# - `positions` 每个请求都从 0 开始（RoPE 用）。
# - `slot_mapping` 是每个新 token 的 K/V 要写进的 slot；`block_tables` 用 0 补齐成矩形，补出来的部分由 `context_lens` 屏蔽。
#
# 用公式验证每个 slot：

# %%
def check_slots(step, block_size=BS):
    slots = step["meta"].slot_mapping.tolist()
    expected = []
    if step["phase"] == "prefill":
        cu = step["meta"].cu_seqlens_q.tolist()
        ctx = step["meta"].context_lens.tolist()
        for i, table in enumerate(step["block_table_lists"]):
            n_new = cu[i + 1] - cu[i]
            for p in range(ctx[i] - n_new, ctx[i]):
                expected.append(table[p // block_size] * block_size + p % block_size)
    else:
        for table, length in zip(step["block_table_lists"], step["seq_lens"]):
            p = length - 1                      # decode: the newest token sits at position len - 1
            expected.append(table[p // block_size] * block_size + p % block_size)
    assert slots == expected, (slots, expected)
    return True


print("all slots match the formula:", all(check_slots(step) for step in captured))
show(captured[1])

# %% [markdown]
# decode 步每个请求只有 1 个 token：它的 position 是 `len - 1`（刚采样出来、还没存 K/V 的那个 token），
# `context_lens = len`（attention 要看的 K/V 个数，包括它自己）。decode 的 metadata 不需要 `cu_seqlens`：每个请求正好一行。

# %% [markdown]
# ## 2. `kv_cache` 里写进了什么
#
# 引擎结束后，把 layer 0 的 K 按 slot 展开，看哪些 slot 有数据，按请求上色。

# %%
kv = llm.model_runner.kv_cache
k0 = kv[0, 0].reshape(-1, kv.shape[-2] * kv.shape[-1]).float().cpu()
written = (k0.abs().sum(dim=1) > 0).numpy()
owner = np.full(kv.shape[2] * BS, -1)
final_tables = captured[-1]["block_table_lists"]
for i, table in enumerate(final_tables):
    for b in table:
        owner[b * BS:(b + 1) * BS] = i
image = np.where(written, owner, -1).reshape(-1, BS)[: max(max(t) for t in final_tables) + 2]
fig, ax = plt.subplots(figsize=(3.5, 4))
cmap = plt.matplotlib.colors.ListedColormap(["#eeeeee", "#1f77b4", "#ff7f0e", "#2ca02c"])
ax.imshow(image + 1, cmap=cmap, vmin=0, vmax=3, aspect="auto")
ax.set(xlabel="offset in block", ylabel="physical block", title="slots holding K (layer 0)")
plt.tight_layout()
plt.show()
for i, (p, table) in enumerate(zip(prompts, final_tables)):
    stored = len(p) + 3 - 1
    got = int(sum(written[b * BS:(b + 1) * BS].sum() for b in table))
    print(f"request {i}: blocks {table}, slots written {got} = prompt {len(p)} + 2 decoded tokens")
    assert got == stored

# %% [markdown]
# ## 3. `cu_seqlens_q` ≠ `cu_seqlens_k`：prefix 命中与 chunked prefill
#
# prefill 不一定从 position 0 开始。两种情况下，query 只是 prompt 的后一段，但 attention 要看整个前缀的 K/V：
#
# - **prefix 命中**：前面的 block 已经在 cache 里；
# - **chunked prefill**：长 prompt 被切成几段，每步只算一段（`enable_chunked_prefill=True`，每步最多 `max_num_batched_tokens` 个 token）。

# %%
llm = LLM(MODEL, device="auto", kvcache_block_size=BS, num_kvcache_blocks=32)
captured = record_inputs(llm)
shared = list(range(400, 416))                        # two full blocks
llm.generate([shared + [1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
llm.generate([shared + [7, 8, 9, 10]], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
hit = [c for c in captured if c["phase"] == "prefill"][1]
show(hit)
assert hit["meta"].cu_seqlens_q.tolist() == [0, 4] and hit["meta"].cu_seqlens_k.tolist() == [0, 20]

# %%
llm = LLM(MODEL, device="auto", kvcache_block_size=BS, num_kvcache_blocks=32, enable_chunked_prefill=True,
          max_num_batched_tokens=16, enable_prefix_caching=False)
captured = record_inputs(llm)
llm.add_request(list(range(500, 540)), SamplingParams(temperature=0.0, max_tokens=2))
while not llm.is_finished():
    outs = llm.step()
    step = captured[-1]
    print(f"{step['phase']:8} positions {step['positions'][0].item():2d}..{step['positions'][-1].item():2d}  "
          f"cu_seqlens_q={step['meta'].cu_seqlens_q.tolist() if step['meta'].cu_seqlens_q is not None else '-'}  "
          f"cu_seqlens_k={step['meta'].cu_seqlens_k.tolist() if step['meta'].cu_seqlens_k is not None else '-'}  "
          f"sampled={outs[0].new_token_ids}")
chunks = [c for c in captured if c["phase"] == "prefill"]
assert [c["meta"].cu_seqlens_k.tolist()[-1] for c in chunks] == [16, 32, 40]

# %% [markdown]
# 40 个 token 的 prompt 分三段（16 + 16 + 8）。前两段没有采样（`sampled=[]`）：它们的最后一个位置不是 prompt 的最后一个 token，
# logits 没有意义。每段的 `cu_seqlens_k` 是 **这一段的末尾**（16、32、40），而不是整个 prompt 的长度：
# 第一段的 query 看不到还没算的后面的 token。

# %% [markdown]
# ### 3.1 chunked prefill 对 decode 的 ITL 和长 prompt 的 TTFT 做了什么
#
# 架构笔记说 chunked prefill "在 chunk 间让出 GPU 给 decode 任务"，从而 "降低首 token 延迟（TTFT）"。
# 分开看两个数：正在 decode 的请求的 **ITL**（相邻两个 token 的间隔，一个长 prefill 插进来时它出现尖峰），
# 和长 prompt 自己的 **TTFT**。三种做法，同一个场景（4 个请求正在 decode，一个 512 token 的 prompt 到达）：
#
# - `whole`：不切，prompt 一步算完（本引擎默认）；
# - `chunked`：`enable_chunked_prefill=True`，每步最多 128 个 token。本引擎是 prefill-first 调度（`Scheduler` 的 docstring），
#   还在 prefill 的序列每一步都优先拿到下一段，所以 4 段 **连着** 跑完，decode 请求一直等；
# - `interleaved`：笔记伪代码的做法（`yield_to_decode_tasks`）：每算完一段，先让 decode 请求走一步。
#   引擎没有这个选项，下面包装 `Scheduler.schedule` 实现它（只在这个 notebook 里）。
#
# 先用 step 数比较（确定的），再看 CPU 上的毫秒数。

# %%
LONG_PROMPT = [(600 + 7 * j) % 1000 for j in range(512)]
CHUNK = 128


def interleave_decodes(engine):
    """After each prefill chunk, give the decoding sequences one step (the note's yield_to_decode_tasks)."""
    scheduler, original = engine.scheduler, engine.scheduler.schedule
    last = {"prefill": False}

    def schedule():
        mid = [s for s in scheduler.running if s.in_prefill]
        if last["prefill"] and mid and len(mid) < len(scheduler.running):
            for seq in mid:                       # hide the half-prefilled prompt from this decode step
                scheduler.running.remove(seq)
            try:
                seqs = scheduler._schedule_decode()
            finally:
                scheduler.running.extend(mid)
            last["prefill"] = False
            return seqs, False
        seqs, is_prefill = original()
        last["prefill"] = is_prefill
        return seqs, is_prefill

    scheduler.schedule = schedule


def long_prompt_arrives(mode):
    """Worst decode ITL (ms, steps) and the long prompt's TTFT (ms, steps) in one run of the scenario."""
    chunked = mode != "whole"
    engine = LLM(MODEL, device="cpu", kvcache_block_size=16, num_kvcache_blocks=256, enable_prefix_caching=False,
                 max_model_len=1024, enable_chunked_prefill=chunked, max_num_batched_tokens=CHUNK if chunked else 1024)
    if mode == "interleaved":
        interleave_decodes(engine)
    decoding = [engine.add_request([(100 + 10 * i + j) % 1000 for j in range(16)],
                                   SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)) for i in range(4)]
    for _ in range(4):
        engine.step()
    long_id = engine.add_request(LONG_PROMPT, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while not engine.is_finished():
        engine.step()
    events = engine.log.events
    gaps = []
    for seq_id in decoding:
        tokens = [e for e in events if e["seq_id"] == seq_id and e["event"] in ("FIRST_TOKEN", "TOKEN")]
        gaps += [(b["time"] - a["time"], b["step"] - a["step"]) for a, b in zip(tokens, tokens[1:])]
    arrived = next(e for e in events if e["seq_id"] == long_id and e["event"] == "ARRIVED")
    first = next(e for e in events if e["seq_id"] == long_id and e["event"] == "FIRST_TOKEN")
    return {"itl_ms": max(g for g, _ in gaps) * 1e3, "itl_steps": max(s for _, s in gaps),
            "ttft_ms": (first["time"] - arrived["time"]) * 1e3, "ttft_steps": first["step"] - arrived["step"]}


MODES = ("whole", "chunked", "interleaved")
runs = {mode: [] for mode in MODES}
for _ in range(3):                              # interleaved rounds; the fastest of each is kept
    for mode in MODES:
        runs[mode].append(long_prompt_arrives(mode))
best = {mode: {k: min(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
n_chunks = -(-len(LONG_PROMPT) // CHUNK)
for mode, r in best.items():
    print(f"{mode:12} worst decode ITL {r['itl_steps']:2d} steps {r['itl_ms']:7.1f} ms | "
          f"long prompt TTFT {r['ttft_steps']:2d} steps after arrival {r['ttft_ms']:7.1f} ms")
assert best["whole"]["itl_steps"] == 2 and best["chunked"]["itl_steps"] == n_chunks + 1
assert best["interleaved"]["itl_steps"] == 2
assert best["interleaved"]["ttft_steps"] == best["chunked"]["ttft_steps"] + n_chunks - 1 > best["whole"]["ttft_steps"]
assert best["interleaved"]["itl_ms"] < 0.75 * best["whole"]["itl_ms"], "interleaving shortens the decode ITL spike"

# %% [markdown]
# 读数（上一格的断言）：
#
# - **只切不让**（`chunked`）：decode 请求的最长 ITL 从 2 步变成 段数 + 1 步 —— 切段本身不缩短 ITL，本引擎的 prefill-first
#   调度让各段连着跑。切段保证的是每一步最多 `max_num_batched_tokens` 个 token（每步的激活内存和时间有上限）。
# - **切了并且让**（`interleaved`）：最长 ITL 回到 2 步，每一步只有一段 prefill，毫秒数明显变短（断言：不到 `whole` 的 3/4）。
#   这才是笔记说的效果，而它的代价落在长 prompt 自己身上：它的第一个 token 晚了 段数 − 1 个 decode 步。
# - 所以笔记 "降低首 token 延迟" 的说法要分对象：降低的是 **别的** 请求的 ITL（以及 TPOT 的 p99），被切的那个请求的 TTFT 按 step 算
#   是变长的。CPU 上的毫秒数在这一点上会 "骗人"：tiny model 一步算完 512 个 token 时要写出整个 512×512 的分数矩阵
#   （Tutorial 02 第 5 节），所以不切反而更慢，`interleaved` 的 TTFT 毫秒数可能比 `whole` 还短。在 GPU 的大模型上，prefill 的时间随 token 数
#   近似线性，切段不省计算，TTFT 就是变长。下一格用课程在 H100 上记录的数字算一个例子。
#
# 笔记里的伪代码本身也跑不起来：`prefill_long_sequence` 是普通函数，里面却写了 `await`：

# %%
NOTE_SNIPPET = """
def prefill_long_sequence(self, input_ids):
    for i, chunk in enumerate(chunks):
        kv_cache = model(input_ids=chunk, past_key_values=kv_cache, use_cache=True).past_key_values
        if i < len(chunks) - 1:
            await self.yield_to_decode_tasks()
"""
try:
    compile(NOTE_SNIPPET, "architecture-note", "exec")
    raise AssertionError("the note's snippet compiled")
except SyntaxError as err:
    print(f"SyntaxError: {err.msg} (line {err.lineno})")

# %%
RESULTS = os.path.join(os.pardir, "docs", "results")
PREFILL_RUN = os.path.join(RESULTS, "2026-11-25", "prefill_all.json")
DECODE_RUN = os.path.join(RESULTS, "2026-11-25", "session12", "call1_band_windows.json")
if os.path.isfile(PREFILL_RUN) and os.path.isfile(DECODE_RUN):
    import json
    with open(PREFILL_RUN) as f:
        prefill_rec = json.load(f)
    with open(DECODE_RUN) as f:
        band = next(w for w in json.load(f)["windows"] if w["batch"] == 40)
    per_token_ms = prefill_rec["forward_and_logits_ms"] / prefill_rec["tokens"]
    decode_ms = band["busy_us_per_step"] / 1e3
    prompt, chunk = 4096, 512
    pieces = prompt // chunk
    whole = {"itl": prompt * per_token_ms + decode_ms, "ttft": prompt * per_token_ms}
    inter = {"itl": chunk * per_token_ms + decode_ms, "ttft": prompt * per_token_ms + (pieces - 1) * decode_ms}
    print(f"H100 (recorded, Qwen3-0.6B shape): prefill {per_token_ms * 1e3:.2f} us/token, decode step at batch 40 "
          f"{decode_ms:.2f} ms")
    print(f"a {prompt}-token prompt, {pieces} chunks of {chunk}: decode ITL spike {whole['itl']:.1f} -> {inter['itl']:.1f} ms; "
          f"its own TTFT {whole['ttft']:.1f} -> {inter['ttft']:.1f} ms")
    assert inter["itl"] < 0.5 * whole["itl"] and inter["ttft"] > 2 * whole["ttft"]
else:
    print("没有 docs/results/（不是课程仓库）：H100 的记录数字见 docs/performance.md 的 session 6 和 session 12")

# %% [markdown]
# 用 H100 上记录的 prefill 速度（每 token 约 2.6 µs）和 batch 40 的 decode 步（约 3.5 ms）估算一个 4096 token 的 prompt 切成 8 段：
# 正在 decode 的请求的 ITL 尖峰从约 14 ms 降到约 5 ms，被切的请求自己的 TTFT 从约 11 ms 涨到约 35 ms（断言：ITL 降到一半以下，TTFT 涨到两倍以上）。
# chunked prefill 是在两类请求之间分配等待，不是凭空减少等待。

# %% [markdown]
# ## 4. 和稠密实现对答案
#
# 分页、扁平化、slot 映射，任何一处算错，生成的 token 就会变。Hugging Face `transformers` 的 `generate` 用普通的稠密 attention，
# 当作独立的 oracle：同样的权重、greedy decoding，token 必须一模一样。

# %%
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()
llm = LLM(MODEL, device="auto", kvcache_block_size=BS)
params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
ours = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=llm.config.torch_dtype).to(llm.config.device).eval()
gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
for p, mine in zip(prompts, ours):
    ids = torch.tensor([p], device=llm.config.device)
    with torch.no_grad():
        theirs = hf.generate(ids, generation_config=gen_cfg, attention_mask=torch.ones_like(ids))[0, len(p):].tolist()
    print("match" if theirs == mine else "DIFFERENT", mine)
    assert theirs == mine

# %% [markdown]
# ## 5. GPU：CUDA graphs 与 Triton kernel
#
# 在 CPU 上跑的是纯 PyTorch 的 "torch" attention backend（写得清楚、当 oracle 用）。在 GPU 上，引擎还会用：
#
# - **Triton kernel**（`attention_backend="triton"`）：KV store（按 `slot_mapping` 把新 K/V 写进 cache）和 paged decode attention
#   （直接按 `block_tables` 从分页的 cache 里读 K/V，不先拷成连续的张量）。
# - **CUDA graphs**：decode 一步有几百个小 kernel，从 Python 一个个 launch 比它们实际运行还慢。
#   把一次 decode 录成 graph（按 batch size 分桶），之后每步只 replay 一次；prefill 按 token 数分桶，在 attention 处切成几段录。
#   `enforce_eager=True` 关掉它们。
#
# 下面的代码在有 GPU 时实测；没有 GPU 时读课程在 H100 上记录的数字（`docs/results/`，命令和机器见 `docs/performance.md`）。

# %%
def decode_step_ms(llm, batch=8, tokens=32):
    """Median wall time of a decode step, from the lifecycle log's STEP events."""
    vocab = llm.config.hf_config["vocab_size"]
    reqs = [[(13 * i + j) % (vocab - 3) for j in range(32)] for i in range(batch)]
    llm.generate(reqs, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)
    steps = [e for e in llm.log.events if e["event"] == "STEP"]
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:]) if not a["is_prefill"] and not b["is_prefill"]]
    return float(np.median(gaps)) * 1e3


if torch.cuda.is_available():
    print("GPU:", torch.cuda.get_device_name())
    results = {}
    for backend in ("torch", "auto"):
        for eager in (True, False):
            try:
                engine = LLM(MODEL, device="cuda", attention_backend=backend, enforce_eager=eager, max_num_seqs=8)
            except ValueError as err:           # a backend this build or machine does not have
                print(f"attention_backend={backend!r}: not available ({err})")
                continue
            decode_step_ms(engine, tokens=8)    # warm-up
            ms = decode_step_ms(engine)
            graphs = sorted(getattr(engine.model_runner, "graphs", {}) or [])
            name = engine.model_runner.backend.name
            results[(name, eager)] = ms
            tokens = [o["token_ids"] for o in engine.generate(prompts, params, use_tqdm=False)]
            print(f"backend={name:7} enforce_eager={eager!s:5} decode step {ms:6.3f} ms  "
                  f"CUDA graph buckets={graphs or 'none'}  same tokens as CPU oracle: {tokens == ours}")
    fig, ax = plt.subplots(figsize=(6, 2.5))
    labels = [f"{n}\n{'eager' if e else 'graphs'}" for n, e in results]
    ax.bar(labels, list(results.values()), color="#1f77b4")
    ax.set(ylabel="ms per decode step", title="decode step time on the GPU (batch 8)")
    plt.tight_layout()
    plt.show()
else:
    RESULTS = os.path.join(os.pardir, "docs", "results")
    graphs_run = os.path.join(RESULTS, "2026-11-25", "session9", "call7_profile_prefill.json")
    decode_run = os.path.join(RESULTS, "2026-11-24", "profile_decode_h100.txt")
    if os.path.isfile(graphs_run) and os.path.isfile(decode_run):
        import json
        import re
        with open(graphs_run) as f:
            rec = json.load(f)
        print(f"recorded on an NVIDIA H100 80GB HBM3 (2026-11-25, scripts/profile_prefill.py, docs/performance.md "
              f"session 9): one prefill step of {rec['tokens']} tokens, Qwen3-0.6B shape, bf16")
        print(f"  CPU time to launch it: eager {rec['eager_launch_cpu_ms']:.1f} ms, CUDA graphs {rec['launch_cpu_ms']:.1f} ms")
        print(f"  GPU time of the step:  eager {rec['eager_forward_and_logits_ms']:.1f} ms, "
              f"CUDA graphs {rec['forward_and_logits_ms']:.1f} ms")
        with open(decode_run) as f:
            text = f.read()
        phases = {name: float(ms) for name, ms in re.findall(r"^  (\w+)[^\n]*?([\d.]+) ms/step$", text, re.M)[:4]}
        replay = float(re.search(r"graph replay alone: ([\d.]+) ms", text).group(1))
        cpu_ms = phases["schedule"] + phases["prepare_decode"] + phases["postprocess"]
        print(f"  a decode step at batch 256 (docs/results/2026-11-24/profile_decode_h100.txt): CPU work "
              f"{cpu_ms:.1f} ms (schedule, prepare_decode, postprocess), graph replay {replay:.2f} ms on the GPU")
        assert rec["launch_cpu_ms"] < 0.25 * rec["eager_launch_cpu_ms"], "graphs cut the launch's CPU time"
        assert abs(rec["forward_and_logits_ms"] / rec["eager_forward_and_logits_ms"] - 1) < 0.05, "the same GPU work"
        assert 0.2 < cpu_ms / replay < 0.5
    else:
        print("这台机器没有 GPU，也没有课程仓库的 docs/results/：GPU 上的数字见课程的 docs/performance.md")

# %% [markdown]
# ### CUDA graph 的机制
#
# 一个 graph 录下的是 **固定地址** 上的一串 kernel：replay 时不会重新看 Python 代码，输入只能通过事先分配好的静态张量传进去。
# 这就是为什么引擎要为每个 batch size 桶各录一个 graph、每步先把输入拷进静态 buffer 再 replay，
# 形状多变的 prefill 不能整步录：attention 的 grid 和它要 gather 的前缀取决于这一步有哪些序列，不只取决于 token 数。
# 引擎的做法和 vLLM 的 piecewise graphs 一样：按 token 数分桶，把 prefill 在每个 attention 调用处切开，
# 两次 attention 之间的部分（o_proj、MLP、下一层的 norm 和 q/k/v）录成 graph，attention 在两段 replay 之间 eager 地跑
# （`reference/engine/prefill_graphs.py`）。下面用模型里的一个 MLP 演示录制和 replay（只在 GPU 上跑）。

# %%
if torch.cuda.is_available():
    mlp = LLM(MODEL, device="cuda").model_runner.model.model.layers[0].mlp
    hidden = mlp.gate_up_proj.in_features
    static_x = torch.randn(8, hidden, device="cuda", dtype=mlp.gate_up_proj.weight.dtype)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):          # warm up on a side stream before capture
            for _ in range(3):
                mlp(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = mlp(static_x)
        new_x = torch.randn_like(static_x)
        static_x.copy_(new_x)                  # inputs go in through the captured buffer
        graph.replay()
        assert torch.allclose(static_y, mlp(new_x), atol=1e-5)

        def timeit(fn, n=200):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / n * 1e6

        print(f"MLP eager: {timeit(lambda: mlp(static_x)):.1f} us/call, graph replay: {timeit(graph.replay):.1f} us/call")
else:
    print("这一格只在 GPU 上运行（torch.cuda.CUDAGraph 需要 GPU）；上一格给出了课程在 H100 上记录的 graph 与 eager 的对比")

# %% [markdown]
# ### 异步调度：让 CPU 跑在 GPU 前面一步
#
# CUDA graph 省掉的是 launch 的开销；但同步的一步里还有另一段 GPU 在等 CPU 的时间：
# forward 结束 → 把采样出的 token 拷回 CPU → `postprocess`（追加 token、检查 stop、释放 block）→
# 下一步的 `Scheduler.schedule` 和 `prepare_decode` → 才 launch 下一步。batch 为 256 时这段 CPU 工作约 2.5 ms，而一步 GPU 计算约 7.5 ms
# （上面第 5 节的格子读出的 H100 记录，断言：CPU 工作是 GPU 时间的 20%–50%）。
#
# `async_scheduling=True` 把顺序换一下：先调度并 launch 第 k+1 步 —— 它的输入 token 直接取第 k 步留在 GPU 上的采样结果
# （`ModelRunner.launch_decode`），CPU 不用知道它是多少 —— 然后才把第 k 步的 token 读回来做 postprocess，这时 GPU 正在算第 k+1 步。
# 代价有两个：token 在 log 里晚一步出现；一个采样到 stop token 的请求已经被排进了下一步，那一个 token 白算、丢掉。
# 只有纯 greedy decode 会重叠；有请求在等（可能要 prefill）、可能要抢占、或有非 greedy 采样时，引擎先读回再同步地走一步。
#
# 下面在 CPU 上跑同一批请求：token 必须完全一样，log 里 decode token 的 `step` 晚一步。
# 在 H100 上 bench-256 的吞吐因此提高了约 1.35 倍（同一进程里同步、异步各跑一次；最后一格读 `docs/results/` 里的两对记录）。

# %%
from reference.metrics import check_lifecycle

overlap_prompts = [[(7 * i + j) % 1000 for j in range(12 + 5 * i)] for i in range(4)]
overlap_params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
runs = {}
for mode in (False, True):
    engine = LLM(MODEL, device="cpu", dtype="float32", async_scheduling=mode)
    outs = engine.generate(overlap_prompts, overlap_params, use_tqdm=False)
    runs[mode] = ([o["token_ids"] for o in outs], engine.log.events)
assert runs[True][0] == runs[False][0], "async scheduling must not change greedy tokens"
assert check_lifecycle(runs[True][1], async_scheduling=True) == []

def token_steps(events, seq_id=0):
    return [(e["index"], e["step"]) for e in events if e["seq_id"] == seq_id and e["event"] in ("FIRST_TOKEN", "TOKEN")]

print("same tokens:", runs[True][0] == runs[False][0])
print("seq 0 (token index, step it was logged) sync :", token_steps(runs[False][1]))
print("seq 0 (token index, step it was logged) async:", token_steps(runs[True][1]))

# %%
pairs = [os.path.join(os.pardir, "docs", "results", "2026-11-22", f"bench256_both_{i}.json") for i in (1, 2)]
if all(os.path.isfile(p) for p in pairs):
    import json
    for path in pairs:
        with open(path) as f:
            rec = json.load(f)
        sync, overlapped = (rec["engines"][k]["output_tok_per_s"] for k in ("sync", "async"))
        print(f"{os.path.basename(path)} ({rec['environment']['gpu']}, bench-256): sync {sync:,.0f}, "
              f"async {overlapped:,.0f} output tok/s -> {overlapped / sync:.2f}x")
        assert 1.25 < overlapped / sync < 1.45
else:
    print("没有 docs/results/（不是课程仓库）：H100 上的数字见 docs/performance.md 的 session 2")

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** 一个 decode batch 里有 3 个请求，长度分别是 9、16、17，`block_size=8`，block table 分别是 `[4, 7]`、`[0, 2]`、`[5, 1, 3]`。
# 写出这一步的 `positions`、`slot_mapping`、`context_lens`，以及补齐后的 `block_tables`。
#
# **练习 2.** 第 3 节的 chunked prefill 里，如果 `max_num_batched_tokens=12`，40 个 token 的 prompt 会分成几段？每段的 `cu_seqlens_k` 是多少？哪一步第一次采样？

# %%
# 在这里写你的答案


# %% [markdown answer]
# ### 参考答案

# %% [answer]
# 练习 1：position = len - 1；slot = table[p // 8] * 8 + p % 8；context_len = len；block_tables 用 0 补到最长的 3 列
lengths, tables = [9, 16, 17], [[4, 7], [0, 2], [5, 1, 3]]
positions = [n - 1 for n in lengths]
slots = [t[p // 8] * 8 + p % 8 for t, p in zip(tables, positions)]
padded = [t + [0] * (3 - len(t)) for t in tables]
print("positions", positions, "slot_mapping", slots, "context_lens", lengths, "block_tables", padded)
assert positions == [8, 15, 16] and slots == [56, 23, 24]

# 用引擎自己的 prepare_decode 验证（构造 Sequence，填好 block table）
from reference.engine.sequence import Sequence

runner = LLM(MODEL, device="auto", kvcache_block_size=8, num_kvcache_blocks=8).model_runner
seqs = []
for i, (n, t) in enumerate(zip(lengths, tables)):
    seq = Sequence(list(range(n)), SamplingParams(), 8, seq_id=i)
    seq.block_table = t
    seqs.append(seq)
_, pos, meta = runner.prepare_decode(seqs)
assert pos.tolist() == positions and meta.slot_mapping.tolist() == slots
assert meta.context_lens.tolist() == lengths and meta.block_tables.tolist() == padded

# 练习 2：12 + 12 + 12 + 4，cu_seqlens_k 依次是 12、24、36、40；第 4 段算完 prompt 的最后一个 token，才第一次采样
llm = LLM(MODEL, device="auto", kvcache_block_size=BS, num_kvcache_blocks=32, enable_chunked_prefill=True,
          max_num_batched_tokens=12, enable_prefix_caching=False)
captured = record_inputs(llm)
llm.generate([list(range(500, 540))], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
ends = [c["meta"].cu_seqlens_k.tolist()[-1] for c in captured if c["phase"] == "prefill"]
first_token_step = next(e["step"] for e in llm.log.events if e["event"] == "FIRST_TOKEN")
print("cu_seqlens_k ends per chunk:", ends, "| first token sampled in step", first_token_step)
assert ends == [12, 24, 36, 40] and first_token_step == 3
