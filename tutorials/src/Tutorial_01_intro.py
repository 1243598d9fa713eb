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
# 4. 第 1 讲的统一视角：服务行为同时取决于请求、之前的状态和当前的策略；用真实运行反驳三种常见误读。
#
# 本课用的是内置的 tiny model（2 层 Qwen3，随机权重）：生成的文字是乱码，但引擎的每个环节都是真的。
# 有 GPU 时 `device="auto"` 会自动用 GPU。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 65 分钟
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 创建引擎 | 5 | 配置打印是确定的 |
# | 2. 一次 `generate` | 5 | greedy：两次 token 完全相同（断言） |
# | 3. `add_request` + `step()` | 10 | 8 步 = 1 prefill + 7 decode（确定） |
# | 4. 最小日志 | 10 | request 2 第一次调度在 step 3（确定） |
# | 5. 状态化系统与三种误读 | 15 | step 数确定：prefix cache 命中时 prefill 少算、max_num_seqs=1 的等待步数 > 10 × max_num_seqs=8（断言）；batch 16 的 decode 每秒 token 数 > 4 × batch 1（断言），毫秒数随机器变 |
# | 课堂练习 + 第 1 讲讨论任务与课堂讨论 | 20 | 三种卡顿的归类是确定的（断言）；KV 紧时被抢占、prefill 算的 token 超过 prompt 本身（断言），这次 1 次抢占、1.3 倍（确定） |
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
# ## 5. 第 1 讲的统一视角：状态化系统
#
# 第 1 讲把推理服务表述为 "持续携带状态的在线服务系统"：
#
# $$\text{Service Behavior}_t = f(\text{Request}_t,\ \text{State}_{t-1},\ \text{Policy}_t)$$
#
# 同一个请求（$\text{Request}_t$ 不变），系统的行为还取决于它到达时系统里已经有什么（$\text{State}_{t-1}$：KV cache、
# prefix cache 里的 block、running / waiting 队列）和当时的策略（$\text{Policy}_t$：`max_num_seqs` 等调度配置）。
# 下面把同一个请求放进四种情况，只看 log：它第一次被调度前等了几步、prefill 真正算了几个 token、第一个 token 在到达后第几步出来。
# 用 step 计数，结果是确定的。

# %%
VICTIM = list(range(300, 364))                      # 64 tokens: the request we watch
BACKGROUND = [list(range(10 + 50 * i, 58 + 50 * i)) for i in range(6)]


def behave(max_num_seqs=8, busy=False, warm=False):
    """Steps until the victim's first token, and the prompt tokens its prefill computed, for one state and policy."""
    engine = LLM(MODEL, device="auto", max_num_seqs=max_num_seqs, kvcache_block_size=16)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    if warm:                                        # State_{t-1}: the same prompt was served before
        engine.generate([VICTIM], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    if busy:                                        # State_{t-1}: six requests already running or queued
        for prompt in BACKGROUND:
            engine.add_request(prompt, sp)
        engine.step()
    start = len(engine.log.events)
    seq_id = engine.add_request(VICTIM, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while not engine.is_finished():
        engine.step()
    events = [e for e in engine.log.events[start:] if e["seq_id"] == seq_id]
    arrived, first = events[0], next(e for e in events if e["event"] == "FIRST_TOKEN")
    scheduled = next(e for e in events if e["event"] == "SCHEDULED")
    return {"first_token_after_steps": first["step"] - arrived["step"], "prefill_tokens": scheduled["num_new_tokens"]}


cases = {"空闲引擎": behave(),
         "State: prefix cache 里已有这个 prompt": behave(warm=True),
         "State: 6 个请求在前面；Policy: max_num_seqs=1": behave(max_num_seqs=1, busy=True),
         "State: 6 个请求在前面；Policy: max_num_seqs=8": behave(max_num_seqs=8, busy=True)}
for name, r in cases.items():
    print(f"{name:42} 第一个 token 在到达后第 {r['first_token_after_steps']:3d} 步；prefill 算了 {r['prefill_tokens']:2d} 个 token")
idle, warm, queued, open_policy = cases.values()
assert warm["prefill_tokens"] < idle["prefill_tokens"], "state changes the work"
assert queued["first_token_after_steps"] > 10 * max(1, open_policy["first_token_after_steps"]), "policy changes the wait"

# %% [markdown]
# 同一个请求，四种行为（上一格的断言）：prefix cache 里的 block（状态）让 prefill 少算了大半；前面有 6 个请求时，
# `max_num_seqs=1`（策略）让它等到前面的请求一个个做完，`max_num_seqs=8` 让它下一步就进 batch。
# 这就是讲义说 "调度、缓存与执行路径形成连续耦合关系" 的意思：看一个请求的延迟，必须同时看它到达时的状态和当时的策略。
#
# ### 5.1 三种常见误读（第 1 讲），各用一次运行反驳
#
# 1. **"输出慢说明模型不够强。"** 上面四种情况用的是同一个模型、同一个请求，第一个 token 出来的步数差了十倍以上：慢在状态和策略，
#    不在模型。
# 2. **"换更快 kernel 就能解决服务问题。"** kernel 快一倍，最多让每一步快一倍，等待的 **步数** 不变；上面把策略从
#    `max_num_seqs=1` 改成 8，等待的步数少了十倍以上。排队主导时，改策略比改 kernel 有效得多（下一格算出两者能省下的比例）。
# 3. **"设备利用率低就一定算力浪费。"** decode 一步只为每个请求算一个 token，batch 小时算力大部分闲着，但这一步的时间
#    主要花在读权重和状态、以及固定开销上（Tutorial 02 第 5 节）；闲着的算力不是 "浪费" 掉、能被更快的 kernel 拿回来的，
#    要靠 batching（让同一次读取服务更多 token）拿回来。下一格量 batch 1 和 batch 16 的 decode 步。

# %%
import time


def decode_step_seconds(batch, rounds=5):
    """Fastest decode step of a batch of `batch` requests over a few rounds (another process only slows a round)."""
    best = float("inf")
    for _ in range(rounds):
        engine = LLM(MODEL, device="cpu", max_num_seqs=batch, enable_prefix_caching=False)
        for i in range(batch):
            engine.add_request(list(range(20 + i, 36 + i)), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
        engine.step()                               # the prefill
        for _ in range(4):
            start = time.perf_counter()
            engine.step()
            best = min(best, time.perf_counter() - start)
    return best


kernel_2x = 2.0                                     # a kernel twice as fast: at most 2x fewer seconds, same steps
policy_gain = queued["first_token_after_steps"] / max(1, open_policy["first_token_after_steps"])
print(f"误读 2：更快的 kernel 最多省 {1 - 1 / kernel_2x:.0%} 的等待；改策略省 {1 - 1 / policy_gain:.0%}")
step_1, step_16 = decode_step_seconds(1), decode_step_seconds(16)
print(f"误读 3：decode 一步 batch 1 {step_1 * 1e3:.2f} ms，batch 16 {step_16 * 1e3:.2f} ms："
      f"同一步多算 16 倍的 token，时间只多 {step_16 / step_1:.1f} 倍")
assert policy_gain > kernel_2x
assert 16 * step_1 / step_16 > 4, "batching turns idle compute into tokens: over 4x the tokens per second"

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
#
# ### 第 1 讲的课堂讨论（讲义原文）
#
# 课堂讨论围绕系统边界、用户感知与状态瓶颈三个维度展开。
#
# - 大模型服务问题为何不能简化为"将模型部署出去"。
# - 用户感知到的"卡顿"通常对应哪些系统现象。
# - 哪些状态对象更容易成为瓶颈放大器。
#
# 每个回答都要指向一次运行里的一个数字（第 5 节的 `cases`，或者你自己的运行）。

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
# - 执行路径：它相邻两个 token 之间隔了不止一步，中间那一步是别人的 prefill（别人的长 prompt 占住了那一步，这个 ITL 多了一整个 prefill）。
#   用 step 而不是毫秒找这一段：机器偶尔一卡也能造出一个长 ITL，但 "这一步没有调度它" 只有 log 能说。

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
    # the gap between two of its tokens that spans the most steps: a step it sat out is someone else's step
    gap_steps, before, after, ms = max((b["step"] - a["step"], a["step"], b["step"], (b["time"] - a["time"]) * 1e3)
                                       for a, b in zip(tokens, tokens[1:]))
    prefill_steps = [e["step"] for e in events if e["event"] == "STEP" and e["is_prefill"] and before < e["step"] < after]
    if prefill_steps:
        return (f"执行路径（token 之间隔了 {gap_steps} 步：step {before} 到 {after}，中间 step {prefill_steps[0]} "
                f"是别人的 prefill，这个 ITL {ms:.1f} ms）")
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

# %% [markdown answer]
# #### 第 1 讲的课堂讨论
#
# **为何不能简化为 "将模型部署出去"**：第 5 节里同一个模型、同一个请求，第一个 token 出来的步数差了十倍以上，prefill 要算的 token 也差了一大半，
# 差别全部来自部署之后才存在的东西：队列里有谁（状态）、调度怎么配（策略）、cache 里有什么（状态）。"部署出去" 只回答了模型能不能跑，
# 回答不了这些。
#
# **"卡顿" 对应哪些系统现象**：上面讨论任务 1 的三种 —— 排队（queue_time 占 TTFT 的大半）、状态（被抢占后重算）、
# 执行路径（别人的 prefill 插进来，ITL 出现尖峰）；每一种在 log 里都有自己的证据。
#
# **哪些状态对象更容易成为瓶颈放大器**：放大的意思是 "一点点不够，代价成倍增加"。下面的运行里 KV cache 只差几个 block：

# %% [answer]
tight = LLM(MODEL, device="auto", max_num_seqs=4, kvcache_block_size=16, num_kvcache_blocks=10, enable_prefix_caching=False)
prompts = [list(range(40 + 30 * i, 80 + 30 * i)) for i in range(4)]          # 4 x 40 tokens = 4 x 3 blocks at most
tight.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
prefilled = sum(e["num_new_tokens"] for e in tight.log.events if e["event"] == "SCHEDULED" and e["is_prefill"])
preempted = sum(e["event"] == "PREEMPTED" for e in tight.log.events)
print(f"KV cache：{preempted} 次抢占，prefill 共算了 {prefilled} 个 token，prompt 本身只有 {sum(map(len, prompts))} 个 "
      f"（{prefilled / sum(map(len, prompts)):.1f} 倍）")
assert preempted > 0 and prefilled > sum(map(len, prompts))

# %% [markdown answer]
# KV cache 只差几个 block，被抢占的请求就要把已经算过的 prompt 和生成的 token 全部重算一遍：prefill 的工作量超过了 prompt 本身
# （上面打印的倍数，断言大于 1；抢占越多倍数越大），重算又占着别人的 step —— 一个小缺口被放大成了全体的延迟。另外两个常见的放大器：waiting 队列（排在一个长请求后面的所有请求一起等，
# 队头阻塞），和会话历史（多轮对话每轮把整个历史重新 prefill，Tutorial 05 的 prefix caching 就是为它准备的）。
