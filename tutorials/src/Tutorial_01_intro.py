# Tutorial 01 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: 课程导论

# %% [markdown]
# # Tutorial 01 · 导论：从 `LLM.generate` 到推理引擎
#
# **教学目标**
#
# 1. 会用 `LLM.generate` 跑通一批请求，知道返回结果里有什么（`text`、`token_ids`、`finish_reason`）。
# 2. 看懂 `generate` 只是一个循环：`add_request` 把请求排队，`step()` 每调用一次就让引擎前进一步（一次 prefill 或一次 decode）。
# 3. 用引擎的 lifecycle log 打出一份"最小日志"：每一步里每个请求的 request id、prompt 长度和所处阶段（stage）。
#
# 本课用的是内置的 tiny model（2 层 Qwen3，随机权重）：生成的文字是乱码，但引擎的每个环节都是真的。
# 有 GPU 时 `device="auto"` 会自动用 GPU。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 45 分钟
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 创建引擎 | 5 | 配置打印是确定的 |
# | 2. 一次 `generate` | 5 | greedy：两次 token 完全相同（断言） |
# | 3. `add_request` + `step()` | 10 | 8 步 = 1 prefill + 7 decode（确定） |
# | 4. 最小日志 | 10 | request 2 第一次调度在 step 3（确定） |
# | 课堂练习 + 第 1 讲讨论任务 | 15 | 三种卡顿的归类是确定的（断言）；排队那一例 queue_time 占 TTFT 92%–95%（2 次运行） |
#
# 讨论任务 1 先让学生猜三次运行各是哪一种，再运行答案格子揭晓；TTFT 的百分比随机器变，归类不变。

# %%
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch

from courseware.tiny_model import ensure_tiny_model
from reference import LLM, SamplingParams

MODEL = os.environ.get("INFERLAB_MODEL") or str(ensure_tiny_model())
if not torch.cuda.is_available():
    # tiny model 的每个矩阵乘只要几微秒，多线程同步的开销反而更大。
    torch.set_num_threads(1)
print("model:", MODEL)
print("CUDA available:", torch.cuda.is_available())

# %% [markdown]
# ## 1. 创建引擎
#
# `LLM(model_dir, **config)` 读取 Hugging Face 格式的模型目录，加载权重，并按配置分配 KV cache。
# 所有配置都在一个 `Config` dataclass 里，创建时就会校验。

# %%
llm = LLM(MODEL, device="auto", max_num_seqs=4)
cfg = llm.config
print(f"device={cfg.device} dtype={cfg.torch_dtype} max_num_seqs={cfg.max_num_seqs}")
print(f"KV cache: {llm.model_runner.num_kvcache_blocks} blocks x {cfg.kvcache_block_size} tokens, "
      f"max_model_len={cfg.max_model_len}")

# %% [markdown]
# ## 2. 一次 `generate`
#
# `SamplingParams(temperature=0.0)` 是 greedy decoding：同样的输入，每次得到同样的 token。
# 结果按输入顺序返回。

# %%
prompts = ["你好！", "What is the KV cache?", "请解释 prefill 和 decode。"]
params = SamplingParams(temperature=0.0, max_tokens=8)
outputs = llm.generate(prompts, params, use_tqdm=False)
for prompt, out in zip(prompts, outputs):
    print(f"{prompt!r:32} -> {len(out['token_ids'])} tokens, finish_reason={out['finish_reason']}")
    print("    token_ids:", out["token_ids"])
again = llm.generate(prompts, params, use_tqdm=False)
assert [o["token_ids"] for o in again] == [o["token_ids"] for o in outputs], "greedy must be deterministic"

# %% [markdown]
# ## 3. 拆开 `generate`：`add_request` + `step()`
#
# `generate` 做的事情可以手写出来：先把每个请求交给 `add_request`（检查、tokenize、建 `Sequence`、排队），
# 然后反复调用 `step()`，直到所有请求结束。每个 `step()` 返回这一步里每个被调度请求得到的新 token。

# %%
seq_ids = [llm.add_request(p, params) for p in prompts]
print("queued seq_ids:", seq_ids)
print("waiting queue:", [s.seq_id for s in llm.scheduler.waiting])
step_no = 0
while not llm.is_finished():
    outs = llm.step()
    print(f"step {step_no}: " + ", ".join(f"seq {o.seq_id} +{o.new_token_ids}" + (" (done)" if o.finished else "")
                                          for o in outs))
    step_no += 1
manual = [llm.finished.pop(i).output_token_ids for i in seq_ids]
assert manual == [o["token_ids"] for o in outputs]
print("same tokens as generate():", manual == [o["token_ids"] for o in outputs])

# %% [markdown]
# 第一步是 **prefill**：三个 prompt 一起算完，每个请求得到第一个 token。
# 之后每一步是 **decode**：每个请求只算一个新 token。
# 所以 `max_tokens=8` 需要 1 次 prefill + 7 次 decode = 8 步。

# %% [markdown]
# ## 4. 最小日志：request id、prompt 长度、stage
#
# 引擎把每个状态变化写进 lifecycle log（`llm.log.events`，也可以写成 JSONL 文件）。
# 下面只挑三类事件打印成一行一条的"最小日志"，这就是课上第一张日志幻灯片的代码。

# %%
def minimal_log(events):
    """One line per request per stage change: the smallest log that still tells the story."""
    prompt_len = {}
    lines = []
    for e in events:
        if e["event"] == "ARRIVED":
            prompt_len[e["seq_id"]] = e["prompt_len"]
            stage = "arrived"
        elif e["event"] == "SCHEDULED":
            stage = "prefill" if e["is_prefill"] else "decode"
        elif e["event"] == "FINISHED":
            stage = f"finished({e['reason']})"
        else:
            continue
        lines.append(f"step={e['step']:<3} request_id={e['seq_id']:<3} "
                     f"prompt_len={prompt_len[e['seq_id']]:<4} stage={stage}")
    return lines


small = LLM(MODEL, device="auto", max_num_seqs=2)
small.generate(["你好！", "What is the KV cache?", "请解释 prefill 和 decode。"],
               SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
log_lines = minimal_log(small.log.events)
print("\n".join(log_lines))

# %% [markdown]
# 这次 `max_num_seqs=2`：同时最多只有两个请求在跑，第三个请求要 **排队**，
# 等前面有请求结束、空出位置之后才被调度。看日志里 `request_id=2` 第一次出现 `stage=prefill` 是在第几步。
#
# 原始事件是 JSON，字段在 `docs/architecture.md` 里有表格。看看 request 0 的前几条：

# %%
for e in [e for e in small.log.events if e["seq_id"] == 0][:4]:
    print(json.dumps(e, ensure_ascii=False))

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** 对上面 `small` 这次运行，用 `small.log.events` 数出每个请求经历了几次 decode 步骤。
# 它和输出 token 数是什么关系？为什么？
#
# **练习 2.** 请求 2 在第几步第一次被调度？它为什么要等？用日志证明你的回答。
#
# ### 第 1 讲的讨论任务（讲义原文）
#
# 1. 判断一次"卡顿"更接近排队、状态还是执行路径问题。
# 2. 在 `example.py` 到 `llm_engine.py` 之间指出最值得优先阅读的两个函数。
#
# 讨论收束问题：课程为何先从系统边界切入，而不是直接从单篇机制论文切入。
#
# （我们的引擎里，`example.py` 的位置是 `reference/llm.py` 的 `LLM`，`llm_engine.py` 是 `reference/engine/llm_engine.py`。）

# %%
# 在这里写你的答案（先自己做）


# %% [markdown answer]
# ### 参考答案

# %% [answer]
from collections import Counter

decode_steps = Counter(e["seq_id"] for e in small.log.events if e["event"] == "SCHEDULED" and not e["is_prefill"])
num_tokens = {e["seq_id"]: e["num_output_tokens"] for e in small.log.events if e["event"] == "FINISHED"}
for seq_id in sorted(num_tokens):
    print(f"request {seq_id}: {decode_steps[seq_id]} decode steps, {num_tokens[seq_id]} output tokens")
    # prefill 产生第一个 token，之后每个 decode 步骤产生一个：decode 步数 = 输出 token 数 - 1
    assert decode_steps[seq_id] == num_tokens[seq_id] - 1

first_sched = {}
for e in small.log.events:
    if e["event"] == "SCHEDULED":
        first_sched.setdefault(e["seq_id"], e["step"])
first_finish = min(e["step"] for e in small.log.events if e["event"] == "FINISHED")
print("first SCHEDULED step per request:", first_sched)
print("first FINISHED at step", first_finish)
# max_num_seqs=2：请求 2 要等到有一个请求结束（FINISHED 之后的下一步）才能进入 running
assert first_sched[2] == first_finish + 1

# %% [markdown answer]
# #### 第 1 讲讨论任务 1：三种"卡顿"，各由 log 里的一个证据认出来
#
# 下面造三次运行，每次让同一个用户请求（最后到达的那个）感到"卡"，然后只看 log 判断原因：
#
# - 排队：`queue_time`（`ARRIVED` 到第一次 `SCHEDULED`）占了 TTFT 的大半；
# - 状态：请求被 `PREEMPTED`（KV block 不够），要重新 prefill；
# - 执行路径：相邻两个 token 之间的间隔（ITL）最长的那一段里夹着一个 prefill 步（别人的长 prompt 占住了那一步）。

# %% [answer]
from reference.metrics import request_metrics


def diagnose(events, seq_id):
    """排队 / 状态 / 执行路径：用 log 里的证据给一次卡顿归类（按这个顺序检查）。"""
    m = request_metrics(events)[seq_id]
    if any(e["event"] == "PREEMPTED" and e["seq_id"] == seq_id for e in events):
        return "状态（被抢占，KV block 不够）"
    if m.queue_time > 0.5 * m.ttft:
        return f"排队（queue_time 占 TTFT {m.queue_time / m.ttft:.0%}）"
    tokens = [e for e in events if e["seq_id"] == seq_id and e["event"] in ("FIRST_TOKEN", "TOKEN")]
    gaps = [(b["time"] - a["time"], a["step"], b["step"]) for a, b in zip(tokens, tokens[1:])]
    _, before, after = max(gaps)
    prefill_steps = [e["step"] for e in events if e["event"] == "STEP" and e["is_prefill"] and before < e["step"] < after]
    if prefill_steps:
        return f"执行路径（最长 ITL 从 step {before} 到 {after}，中间 step {prefill_steps[0]} 是别人的 prefill）"
    return "看不出来"


def run(n_requests=3, late_prompt=None, **config):
    engine = LLM(MODEL, device="auto", enable_prefix_caching=False, **config)
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ids = [engine.add_request([11 + i] * 40, sp) for i in range(n_requests)]
    for _ in range(3):
        engine.step()
    if late_prompt is not None:                      # 别人的长 prompt 在中途到达
        engine.add_request(late_prompt, sp)
    while not engine.is_finished():
        engine.step()
    return engine.log.events, ids[-1]


cases = {"排队": run(max_num_seqs=1),
         "状态": run(kvcache_block_size=16, num_kvcache_blocks=10),   # 3 x 3 blocks 放得下 prefill，长到 4 个就不够
         "执行路径": run(late_prompt=list(range(200, 456)))}
for expected, (evs, victim) in cases.items():
    verdict = diagnose(evs, victim)
    print(f"{expected:6} -> {verdict}")
    assert verdict.startswith(expected), (expected, verdict)

# %% [markdown answer]
# 同一个症状（"卡"），三种完全不同的原因，要改的地方也不同：排队改调度和容量，状态改 KV 管理，执行路径改调度策略（如 chunked prefill）或 kernel。
# 所以先看 log 分清是哪一种，再谈优化。
#
# #### 讨论任务 2：最值得先读的两个函数

# %% [answer]
import inspect
for fn in (LLM.generate, LLM.step):
    src, line = inspect.getsourcelines(fn)
    print(f"{fn.__qualname__:18} {inspect.getsourcefile(fn).split('reference')[-1]}:{line} ({len(src)} lines)")
print("step() calls in the manual loop above:", step_no, "= every token of every request passed through it")

# %% [markdown answer]
# `LLM.generate`（入口：请求怎样变成 `Sequence` 并排队）和 `LLMEngine.step`（每一步：调度 → 执行 → 后处理）。
# 第 3 节手写的循环就是这两个函数：`add_request` 之后反复 `step()`，所有请求的所有 token 都从 `step()` 出来。
#
# **讨论收束问题** 因为单篇机制论文（PagedAttention、chunked prefill……）都只改系统里的一个控制点；
# 先画清系统边界和请求、状态、控制点，才知道一个机制改的是哪一段、该用哪个指标验证它（上面三种卡顿就是例子）。

