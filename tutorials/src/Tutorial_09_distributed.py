# Tutorial 09 source (percent format): python tutorials/_make_notebooks.py turns it into a notebook.
# title: 分布式推理与PD分离

# %% [markdown]
# # Tutorial 09 · 分布式推理：Tensor Parallelism 与 Prefill/Decode 分离
#
# **教学目标**
#
# 1. 说清楚多卡部署里哪些组件是 **单实例**（只在 rank 0：scheduler、block manager、sampler），哪些是 **每卡一份**（权重分片、KV cache、CUDA graph）；TP、PP、DP 各切什么、每步通信什么。
# 2. 理解 column-parallel 与 row-parallel 为什么只需要 **一次 all-reduce**，从模型配置算出每 token 每层的通信量，并和 TP=2 实测的 all-reduce 字节数对账。
# 3. 在 CPU 上（gloo）跑 `tensor_parallel_size=2` 的真实引擎：token 与单卡完全一致，再测出通信带来的开销。
# 4. 跑 prefill/decode 分离：prefill 进程算出第一个 token 后，把 KV blocks 用 `torch.distributed` 发给 decode 进程；从配置算出每 token 的 KV 字节数并核对实测传输，判断分离什么时候划算。
#
# 第 7 讲说："单机上看起来只是'多开几个请求'的问题，进入分布式拓扑后会变成通信和协调问题。"
# 同一个 batch 决策，在单卡上只关心调度和 KV 驻留；在 TP 下每一步都要跨卡同步；在 PD 分离下还要搬运 KV。

# %% [markdown instructor]
# **教师注释**（学生版不含）· 共约 60 分钟
#
# 下表每个数字都有格子里的断言（括号里是断言的界）；只说 "随机器变" 的数字没有断言，不要拿它们和学生对答案。
#
# | 节 | 分钟 | 预期数字（tiny model，2 核 CPU） |
# | --- | --- | --- |
# | 1. 拓扑（TP / PP / DP） | 10 | 表格；第 3 节里 all-reduce 字节数 = 公式（断言，确定） |
# | 2. Column + row parallel | 15 | 手算结果与整块矩阵相等（断言）；2.1 按词表段取的 argmax = 整行 argmax，并列取第 10 列（断言，确定） |
# | 3. TP=2 引擎 | 10 | CPU 上两个进程（gloo）；tokens 与 TP=1 相同（断言）；TP=2 每步比 TP=1 慢（断言），倍数随机器变；H200 记录：每步 all-reduce 1.8 ms（断言：1–3 ms） |
# | 3.1 GPU 实测（两张 H100 的记录） | 5 | 8B 形状 TP=2 / TP=1 = 1.41–1.49，6 次都在 1.3–1.6 之间（断言）；3.2 末尾：最新记录 1.53（断言：1.45–1.6）；all-reduce 占 TP=2 每步约 11%（B=64）/ 15%（B=256）（断言：5–30%）；GEMM、attention 减半（断言：TP=2 不到 TP=1 的 0.6），norm 不减 |
# | 4. PD 分离 | 20 | KV 搬运后 token 与单引擎相同、字节数 = blocks × 16 × 512、`cached_blocks` = [0, 2, 2, 2, 2, 2]（断言，确定）；最快的一次传输 < prefill 步的中位数（断言）。传输的中位数和有效带宽随机器负载变（见过 8.7 ms 的中位数），只打印不断言；Qwen3-0.6B 记录算出的临界带宽约 44 GB/s（断言：25–400 GB/s） |
# | 课堂练习 | 10 | 见答案格子里的断言 |

# %%
import os
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
# TP=2 需要两张 GPU；没有两张卡时就在 CPU 上开两个进程（gloo 后端）
TP_DEVICE = "cuda" if torch.cuda.device_count() >= 2 else "cpu"
print("TP device:", TP_DEVICE)

# %% [markdown]
# ## 1. 拓扑：谁是单实例，谁每卡一份
#
# | 组件 | 位置 | 原因 |
# | --- | --- | --- |
# | `LLM` / `LLMEngine`、tokenizer、lifecycle log | 单实例，rank 0 | 请求从一个地方进、结果从一个地方出 |
# | `Scheduler`、`BlockManager`、`Sequence` | 单实例，rank 0 | 每一步只能有 **一个** batch 决策，所有卡必须算同一个 batch |
# | sampler | 单实例，rank 0 | all-gather 之后每张卡都有完整 logits，只由 rank 0 采样 |
# | `ModelRunner`（准备输入、forward） | 每卡一份 | 每张卡从广播来的 batch 构造同样的输入张量 |
# | 权重 | 每卡 1/N | QKV、gate、up 按列切；o、down 按行切；embedding 和 LM head 按词表切 |
# | KV cache | 每卡一份，只存自己的 KV heads | 每张卡的 block 数和 block id 相同，所以一张 block table 对所有卡都成立 |
#
# 每一步：rank 0 调度 → 把 batch **广播** 给其它 rank → 每个 rank 算自己那份 → 在 all-reduce 处会合 → rank 0 采样。
#
# 多卡的三种切法，切的东西不同，每一步要通信的东西也不同（*L* 层，hidden 维 *h*，每个值 *b* 字节，*N* 份）：
#
# | 方式 | 切什么 | 每张卡上有什么 | 每个 token 的通信 | 本引擎 |
# | --- | --- | --- | --- | --- |
# | TP（tensor parallel） | 每层的权重矩阵 | 每层 1/N 的权重、1/N 的 KV heads | 每层 2 次 all-reduce，各 *h*·*b* 字节（再加 embedding 1 次） | 实现（第 3 节实测） |
# | PP（pipeline parallel） | 层：每卡连续 *L*/*N* 层 | 自己那几层的全部权重和 KV | 每个 stage 边界发一次激活，*h*·*b* 字节 | 未实现，只给公式 |
# | DP（data parallel，多副本） | 请求 | 完整模型的一份副本，自己的 scheduler 和 KV | 每步不通信，只有请求路由 | 未实现：就是开 N 个 `LLM` |
#
# 所以 TP 的通信量随层数增长、每层都要同步，适合机内高带宽互联（NVLink）；PP 每 token 只在边界传一次，但要靠 micro-batch
# 填满流水线；DP 不通信，但每个副本都要放得下整个模型。第 3 节在 TP=2 的真实运行里数出 all-reduce 的次数和字节数，
# 和这里的公式对账。

# %% [markdown]
# ## 2. Column-parallel + row-parallel：一次 all-reduce
#
# MLP 是 `down(silu(gate(x)) * up(x))`。把 gate、up 的 **输出特征**（行）切成两半，每个 rank 只算一半的中间特征；
# `silu(...) * ...` 是逐元素的，不需要通信；再把 down 的 **输入特征**（列）切成两半，每个 rank 得到一个 **部分和**。
# 两个部分和相加（all-reduce）就是完整结果。Attention 同理：每个 rank 负责一部分 head（QKV 按列切，o_proj 按行切）。

# %%
gen = torch.Generator().manual_seed(0)
H, I, N = 64, 256, 2
x = torch.randn(8, H, generator=gen, dtype=torch.float64)
gate, up = (torch.randn(I, H, generator=gen, dtype=torch.float64) for _ in range(2))
down = torch.randn(H, I, generator=gen, dtype=torch.float64)


def mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


partials = [mlp(x, gate.chunk(N, 0)[r], up.chunk(N, 0)[r], down.chunk(N, 1)[r]) for r in range(N)]
diff = (mlp(x, gate, up, down) - sum(partials)).abs().max().item()
print(f"完整 MLP vs 两个 rank 的部分和相加：max |diff| = {diff:.1e}")
assert diff < 1e-9

# %% [markdown]
# 引擎里这些层在 `reference/layers/linear.py`：`ColumnParallelLinear`、`RowParallelLinear`（forward 末尾 all-reduce）、
# `VocabParallelEmbedding`（每个 rank 查自己那段词表，其它位置填 0，再 all-reduce）、`ParallelLMHead`（all-gather logits；
# 全是 greedy 请求时不 gather，见 2.1）。
#
# 每个 decode step 的通信量：每层 2 次 all-reduce（o_proj、down_proj），再加 embedding 1 次，
# 每次 `batch × hidden × 字节数`。下面算 tiny model 和 Qwen3-8B 形状（bf16）的数字。

# %%
def allreduce_bytes_per_step(layers, hidden, batch, bytes_per_value):
    calls = 2 * layers + 1
    return calls, calls * batch * hidden * bytes_per_value


import json

tiny = json.load(open(os.path.join(MODEL, "config.json")))
for name, layers, hidden, nbytes in [("tiny (fp32)", tiny["num_hidden_layers"], tiny["hidden_size"], 4),
                                     ("Qwen3-8B (bf16)", 36, 4096, 2)]:
    calls, total = allreduce_bytes_per_step(layers, hidden, 64, nbytes)
    print(f"{name:16s} batch 64: {calls} 次 all-reduce，共 {total / 2**20:.2f} MiB / step")

# %% [markdown]
# ### 2.1 LM head：greedy 不需要把 logits gather 回来
#
# `ParallelLMHead` 按 **词表** 切：rank r 只有第 r 段词表的 logits。要 sample（temperature > 0、top-k/top-p）就得把整行
# all-gather 回来，每步 `batch × vocab / N` 个值；但 greedy 只要整行的 argmax，而 **各段最大值里的最大值就是整行最大值**。
# 于是每个 rank 先取自己那段的 argmax，再只交换每行 **一个 int64**：高 32 位放最大 logit 的 "顺序键"（与浮点大小同序，
# NaN 最大、-0.0 = +0.0），低 32 位放 `0xFFFFFFFF - 全局列号`。取所有 rank 里最大的那个数，就是 `torch.argmax` 的答案，
# 连 "并列时取最前的列" 这条规则都对（列号越小，补码越大）。每个 rank 都拿到同一组 token，rank 0 也不必再 broadcast。
# 引擎里是 `reference/layers/sampler.py` 的 `best_of_slice` / `token_of_best`，下面在 CPU 上直接验证。

# %%
from reference.layers.sampler import best_of_slice, token_of_best

rows, vocab = 6, 37
logits = torch.randn(rows, vocab, generator=gen)
logits[0, 10] = logits[0, 30] = logits[0].max() + 1     # 同一行的最大值出现在两段里：应取第 10 列
cut = 19                                               # rank 0: 列 [0, 19)，rank 1: 列 [19, 37)
packed = torch.stack([best_of_slice(logits[:, :cut], 0), best_of_slice(logits[:, cut:], cut)])
tokens = token_of_best(packed)
print("按段取 argmax：", tokens.tolist())
print("整行 argmax：  ", logits.argmax(-1).tolist())
assert torch.equal(tokens, logits.argmax(-1)) and tokens[0].item() == 10

for name, batch in (("B=64", 64), ("B=256", 256)):
    gathered = batch * (151936 // 2) * 2          # Qwen3-8B 词表，TP=2，bf16：每个 rank 要收的 logits 字节数
    print(f"{name}: all-gather logits {gathered / 2**20:.1f} MiB vs 交换 {batch * 8} 字节")

# %% [markdown]
# ## 3. 真实的 TP=2 引擎
#
# `tensor_parallel_size=2`：引擎自己用 `torch.multiprocessing`（spawn）启动 rank 1；CPU 上用 gloo，GPU 上用 NCCL。
# 下面比较 TP=1 与 TP=2 的 greedy token（fp32 下应当 **完全相同**），以及每一步的时间。

# %%
prompts = [list(range(1 + 7 * i, 1 + 7 * i + n)) for i, n in enumerate([5, 17, 33, 40])]
params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
config = dict(dtype="float32", num_kvcache_blocks=64, max_model_len=256, max_num_batched_tokens=256)


def timed_generate(llm, repeats=3):
    llm.generate(prompts, params, use_tqdm=False)                 # warm-up
    best = float("inf")
    for _ in range(repeats):
        start, steps = time.perf_counter(), llm.step_index
        out = llm.generate(prompts, params, use_tqdm=False)
        best = min(best, (time.perf_counter() - start) / (llm.step_index - steps))
    return [o["token_ids"] for o in out], best


tp1 = LLM(MODEL, device="auto", **config)
tokens1, step1 = timed_generate(tp1)
tp2 = LLM(MODEL, device=TP_DEVICE, tensor_parallel_size=2, **config)
attn = tp2.model_runner.model.model.layers[0].self_attn
print(f"rank 0 每层持有 {attn.num_heads} 个 query head、{attn.num_kv_heads} 个 KV head")
tokens2, step2 = timed_generate(tp2)

# 数 rank 0 上每一次浮点 all-reduce 的元素个数（rank 1 做的是同样的调用）
import torch.distributed as dist

reduced, real_all_reduce = [], dist.all_reduce


def counting_all_reduce(tensor, *args, **kwargs):
    if tensor.is_floating_point():                                  # 不数控制用的整数 all-reduce
        reduced.append(tensor.numel())
    return real_all_reduce(tensor, *args, **kwargs)


dist.all_reduce = counting_all_reduce
try:
    steps_before = len(tp2.log.events)
    tp2.generate(prompts, params, use_tqdm=False)
finally:
    dist.all_reduce = real_all_reduce
tp2.model_runner.close()                                           # 停掉 rank 1
tokens_run = sum(e["num_tokens"] for e in list(tp2.log.events)[steps_before:] if e["event"] == "STEP")
per_token_layer = 2 * tiny["hidden_size"] * 4                      # 每 token 每层：2 次 all-reduce × h × 4 字节（fp32）
predicted = tokens_run * (tiny["num_hidden_layers"] * per_token_layer + tiny["hidden_size"] * 4)   # + embedding
measured = sum(reduced) * 4
print(f"{tokens_run} 个 token 过了模型：公式预测 all-reduce {predicted / 1024:.1f} KiB，实测 {measured / 1024:.1f} KiB"
      f"（{len(reduced)} 次调用；每 token 每层 {per_token_layer} 字节）")
assert measured == predicted
print("TP=2 tokens == TP=1 tokens:", tokens2 == tokens1)
print(f"每步时间：TP=1 {step1 * 1e3:.2f} ms，TP=2 {step2 * 1e3:.2f} ms")
assert tokens2 == tokens1
if TP_DEVICE == "cpu":
    assert step2 > step1, "on the CPU the gloo all-reduces cost more than the halved matmuls save"
assert not any(p.is_alive() for p in tp2.model_runner.workers)

# %%
plt.figure(figsize=(4, 3))
plt.bar(["TP=1", "TP=2"], [step1 * 1e3, step2 * 1e3], color=["tab:blue", "tab:orange"])
plt.ylabel("ms / step")
plt.title(f"tiny model on {TP_DEVICE}")
plt.tight_layout()
plt.show()

# %% [markdown]
# 在 CPU 上跑 tiny model，TP=2 **更慢**：每层的矩阵乘只要几微秒，而每次 gloo all-reduce 要经过进程间通信，
# 还要加上每步一次把 batch 发给 worker。TP 只有在 **计算量大到能盖过通信** 时才划算：
# 大模型（8B 的一层矩阵乘要几百微秒）+ NVLink 上的 NCCL（一次 all-reduce 几十微秒）。
# GPU 上的记录（两张 H200，`scripts/gpu_tp.sh`，`docs/performance.md`）由下一格读出。

# %%
TP_RUN = os.path.join(os.pardir, "docs", "results", "2026-11-24", "gpu_tp_h200x2.json")
if os.path.isfile(TP_RUN):
    with open(TP_RUN) as f:
        tp_rec = json.load(f)
    print(f"{' + '.join(tp_rec['environment']['gpus'])}, torch {tp_rec['environment']['torch']}, 2026-11-24, "
          f"Qwen3-8B shape (bf16), NCCL:")
    calls = 2 * 36                                  # 2 all-reduces a layer (o_proj, down_proj), 36 layers
    for tokens, row in sorted(tp_rec["allreduce"]["by_tokens"].items(), key=lambda kv: int(kv[0])):
        print(f"  {int(tokens):5d} tokens: {row['per_call_us']:6.1f} us a call x {calls} = {row['per_step_ms']:.2f} ms a step")
        assert abs(row["per_call_us"] * calls / 1e3 - row["per_step_ms"]) < 1e-6
    one = tp_rec["allreduce"]["by_tokens"]["1"]
    print(f"  fp32 tokens equal to TP=1: {tp_rec['fp32_equality']['prompts_equal']}/{tp_rec['fp32_equality']['prompts']}; "
          f"bf16 first token equal: {tp_rec['bf16_agreement']['first_token_agreement']:.0%}")
    assert tp_rec["fp32_equality"]["equal"] and 1.0 < one["per_step_ms"] < 3.0
else:
    print("没有 docs/results/（不是课程仓库）：两张 H200 上的 TP 记录见 docs/performance.md")

# %% [markdown]
# 两张 H200 上（上一格的断言）：NCCL 的一次 all-reduce 约 25 µs，8B 形状每个 decode step 要 72 次，约 1.8 ms —— 这是 TP=2 每一步固定要付的通信；
# fp32 下 TP=2 的 token 和单卡完全相同。TP=2 的吞吐那次没有测到：TP=2 引擎退出时挂起。原因后来查明（issue 35）：NCCL 不肯销毁一个还被 CUDA graph 引用着的 communicator，而引擎退出时先离开进程组、后释放 decode graphs；现在顺序倒过来了（`docs/distributed.md`）。
#
# 还要注意：bf16 下 TP=2 与 TP=1 的 token 不保证完全一致。每个 rank 的部分和先舍入到 bf16 再相加，
# 而单卡是在 fp32 里累加完整的点积后只舍入一次；随机权重下很多 logit 几乎相等，一次舍入差异就可能翻转 greedy token。
# `docs/distributed.md` 写了容差（第一个 token 至少 90% 相同）和原因。

# %% [markdown]
# ### 3.1 GPU 上实测：TP=2 的 scaling 与 all-reduce 的占比
#
# 下一格读出 `scripts/gpu_tp.sh` 在两张 H100（NVLink）上的记录（issue 35，2026-11-27，
# `docs/results/2026-11-27/gpu_tp_call2_h100x2.json`，命令见 `docs/performance.md`），不是现场测的：Qwen3-8B 形状、随机 bf16 权重，
# decode batch B（B 个请求、每个 128 个 prompt token、256 个输出 token，一次全部提交），async scheduling + CUDA graphs，
# 每种配置跑 3 次。profile 一栏是 torch.profiler 在 rank 0 上量的 **每个 decode step 的 GPU 时间**，按 kernel 类别分组。
#
# 理想情况下 TP=2 每卡只读一半权重，decode step 应该快接近 2 倍。看看实际差在哪里。

# %%
TP_RUN_H100 = os.path.join(os.pardir, "docs", "results", "2026-11-27", "gpu_tp_call2_h100x2.json")
if os.path.isfile(TP_RUN_H100):
    with open(TP_RUN_H100) as f:
        rec = json.load(f)
    print(f"{' + '.join(rec['env']['gpus'])}, torch {rec['env']['torch']}, NCCL {rec['env']['nccl']}, 2026-11-27, "
          "Qwen3-8B shape (bf16), decode batch 64 / 256")
    bench = rec["tp_bench"]
    one_shot_us = {b: rec["allreduce"]["by_tokens"][str(b)]["custom_graph_us"] for b in (64, 256)}
    nccl_us = {b: rec["allreduce"]["by_tokens"][str(b)]["nccl_graph_us"] for b in (64, 256)}
    gpu_ms, step_ms = {}, {}
    for batch in (64, 256):
        runs = {tp: [r for r in bench[key]["runs"] if r["batch"] == batch and r["scheduling"] == "async"]
                for tp, key in (("TP=1", "tp1"), ("TP=2", "tp2"))}
        ratios = [b["output_tok_per_s"] / a["output_tok_per_s"] for a, b in zip(runs["TP=1"], runs["TP=2"])]
        step_ms[batch] = {tp: float(np.median([r["decode_step_ms_median"] for r in rs])) for tp, rs in runs.items()}
        gpu_ms[batch] = {tp: dict(bench[key][f"profile_batch{batch}"]["gpu_ms_per_step_by_band"])
                         for tp, key in (("TP=1", "tp1"), ("TP=2", "tp2"))}
        # 每步 73 次 all-reduce；用探针量的单次时间（B=64 那次 profile 里有一次异常的长等待）
        gpu_ms[batch]["TP=2"]["all_reduce"] = 73 * one_shot_us[batch] / 1e3
        share = gpu_ms[batch]["TP=2"]["all_reduce"] / step_ms[batch]["TP=2"]
        tok_s = {tp: ", ".join(f"{r['output_tok_per_s']:,.0f}" for r in rs) for tp, rs in runs.items()}
        print(f"B={batch:3d}: TP=1 {tok_s['TP=1']} tok/s, TP=2 {tok_s['TP=2']}: "
              f"TP=2 / TP=1 = {', '.join(f'{x:.2f}' for x in ratios)}; all-reduce = {share:.0%} of a TP=2 step; "
              f"one all-reduce: NCCL {nccl_us[batch]:.1f} us, one-shot {one_shot_us[batch]:.1f} us")
        assert len(ratios) == 3 and all(1.3 < x < 1.6 for x in ratios)
        assert 0.05 < share < 0.30
        for band in ("gemm", "attention"):   # 被切分的部分确实减半
            assert gpu_ms[batch]["TP=2"][band] < 0.6 * gpu_ms[batch]["TP=1"][band]

    fig, axes = plt.subplots(1, 2, figsize=(6.4, 3.4))
    colors = {"gemm": "tab:blue", "attention": "tab:green", "all_reduce": "tab:red", "all_gather": "tab:purple",
              "other": "tab:gray"}
    for ax, batch in zip(axes, (64, 256)):
        for x, tp in enumerate(("TP=1", "TP=2")):
            bottom = 0.0
            for band, color in colors.items():
                ms = gpu_ms[batch][tp].get(band, 0.0)
                ax.bar(x, ms, bottom=bottom, color=color, label=band if x == 1 else None)
                bottom += ms
        ax.set_xticks([0, 1], ["TP=1", "TP=2"])
        ax.set_ylabel("GPU ms / decode step")
        ax.set_title(f"Qwen3-8B shape, batch {batch}")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    plt.tight_layout()
    plt.show()
else:
    print("没有 docs/results/（不是课程仓库）：两张 H100 上的 TP 记录见 docs/performance.md")

# %% [markdown]
# 读图：**GEMM 和 attention 真的减半了**（它们被切分：每卡一半权重、一半 KV head）。没有减半的是：
#
# - **all-reduce**：单卡根本没有这一项。每步 73 次（36 层 × 2 + embedding 1 次）。用 NCCL 时一次 21–38 µs，
#   B=256 时 73 次就是 2.8 ms，接近一步的三成；本引擎的 one-shot all-reduce（`reference/kernels/all_reduce.py`）让每个 rank
#   把自己的部分 **写进** 对方的显存（CUDA IPC），举旗、等旗，再在本地求和，一次 7.8–16.7 µs。
# - **other（RMSNorm、RoPE、SiLU……）**：Megatron 式的 TP 只切矩阵乘和 attention，norm 在每张卡上对完整的 hidden
#   向量重复做一遍，所以不会变少。
# - LM head 的 **all-gather**，以及每步约 0.4 ms GPU 在等 CPU 的空隙（TP=1 也有）。
#
# 这就是 **Amdahl 定律**：能并行的部分减半，不能并行的部分不变还多了通信，所以实测是 1.41–1.49 倍，而不是 2 倍。
# 在 0.6B 形状上情况更糟（TP=2 只有 TP=1 的 0.6 倍左右）：那里一步的 GPU 时间只有 2–3 ms，步长被 CPU 卡住，
# 而 TP 还要在 rank 0 上多做"把 batch 发给 worker"这件事。**模型越大、batch 越大，TP 越划算。**

# %% [markdown]
# ### 3.2 把 RMSNorm 融进 all-reduce 之后（以及 issue 35 之前的引擎）
#
# 上面的 "other" 里最大的一项是 RMSNorm：每个 block 结束时 all-reduce 出 residual stream，紧接着一个 norm kernel 读它。
# 后来 one-shot all-reduce 多了一个版本 `one_shot_all_reduce_norm`：每个 program 负责整行，求和、加 residual、再做 RMSNorm，
# 一个 kernel 输出 stream 和 normed 两份（模型把"下一个读 stream 的 norm"交给结束 block 的那个 projection，
# 见 `RowParallelLinear` 的 `norm` 参数）。norm 仍在每张卡上重复做，只是省掉了一次 launch 和一遍读写。
# 下一格读出同一种机器（两张 H100）上的三份记录（命令见 `docs/performance.md` 的 "Calls 4-8"）：
# 融合前（call 2）、融合后（call 7），以及 issue 35 之前的引擎（call 8 的 `before`：sync scheduling，NCCL all-reduce）。

# %%
FUSED_DIR = os.path.join(os.pardir, "docs", "results", "2026-11-27", "tp_fused_norm")
if os.path.isfile(TP_RUN_H100) and os.path.isdir(FUSED_DIR):
    with open(os.path.join(FUSED_DIR, "call7_h100x2.json")) as f:
        fused = json.load(f)["tp_bench"]
    with open(os.path.join(FUSED_DIR, "call8_before_h100x2.json")) as f:
        old = json.load(f)["before"]["result"]["runs"]
    unfused = rec["tp_bench"]

    def median_of(bench, tp, batch, field):
        return float(np.median([r[field] for r in bench[tp]["runs"] if r["batch"] == batch and r["scheduling"] == "async"]))

    for batch in (64, 256):
        step = {name: median_of(b, "tp2", batch, "decode_step_ms_median") for name, b in (("before", unfused), ("after", fused))}
        ratio = median_of(fused, "tp2", batch, "output_tok_per_s") / median_of(fused, "tp1", batch, "output_tok_per_s")
        old_tok = next(r["output_tok_per_s"] for r in old if r["batch"] == batch)
        new_tok = median_of(fused, "tp2", batch, "output_tok_per_s")
        print(f"B={batch:3d}: TP=2 decode step {step['before']:.2f} -> {step['after']:.2f} ms with the norm fused in; "
              f"TP=2 / TP=1 now {ratio:.2f}; TP=2 before issue 35 {old_tok:,.0f} tok/s, now {new_tok:,.0f} ({new_tok / old_tok:.2f}x)")
        assert step["after"] < step["before"] and 1.3 < ratio < 1.6 and new_tok > 1.3 * old_tok
else:
    print("没有 docs/results/（不是课程仓库）：这些记录见 docs/performance.md")

# %% [markdown]
# 融合让 TP=2 每步快了 1–3%，离 issue 35 要的 1.6 倍还差得远：剩下的主要是 GPU 上的时间（每步 72 次 all-reduce 约 0.7 ms、
# 每张卡重复的 elementwise、只有一半列的 GEMM 用不满带宽）。顺带一个教训：issue 35 之前的引擎在两张卡上不仅慢，
# 跑完还退不出来（`before` 那一行的进程是被杀掉的）——"能干净地退出"本身就是分布式系统的一项功能。
#
# 再往后（`docs/performance.md` 的 "calls 1-5"，同样是两张 H100）又做了三件事：2.1 节的 greedy 按词表段取 argmax
# （LM head 不再 all-gather logits）；TP=1 引擎之后在同一进程里建的 TP=2 引擎，其 torch.compile 过的 SiLU 曾因
# automatic dynamic shapes 重新编译成"所有维度都是符号"的版本、只跑到一半带宽，现在模型的维度标为静态；
# decode step 只发 block table 新增的项。下一格读出最后一次（call 5）的比值。

# %%
GREEDY_DIR = os.path.join(os.pardir, "docs", "results", "2026-11-27", "tp_greedy_tables")
if os.path.isdir(GREEDY_DIR):
    with open(os.path.join(GREEDY_DIR, "call5_h100x2.json")) as f:
        latest = json.load(f)["tp_bench"]
    for batch in (64, 256):
        runs = latest["tp2_over_tp1"][f"batch{batch}"]["ratio_per_run"]
        print(f"B={batch:3d}: TP=2 / TP=1 = {' / '.join(f'{r:.3f}' for r in runs)}")
        assert all(1.45 < r < 1.6 for r in runs)
else:
    print("没有 docs/results/（不是课程仓库）：这些记录见 docs/performance.md")

# %% [markdown]
# 1.53 之后又试了几样（`docs/performance.md` 的 "fourth stop's calls 1-6"），都没能再往上推：all-reduce 换更多的 program、
# 在 all-reduce 等待的那几微秒里把下一个 GEMM 的权重预取进 L2、NCCL 换 Simple 协议、GEMM 换 cuBLASLt 或转置的权重布局。
# 原因可以用 Amdahl 定律再说一遍，只是这回"不能并行的部分"换成了 **每个 kernel 的固定开销**：
#
# - 每步 144 个 GEMM，TP=2 时每个只有一半大，但 launch、第一次访存的延迟、收尾这些固定成本一分不少。
#   单卡 H100 上量（`scripts/decode_gemms.py --model 8b-tp2`）：batch 64 时一步的 GEMM 2.90 ms，而 TP=1 的一半是 2.72 ms。
# - 72 次 all-reduce，一次最少约 5 µs（1 个 token 时），引擎里约 10 µs，合计约 0.7 ms。
#
# 所以 **GPU 越快，TP=2 越不划算**：H200 的显存带宽比 H100 高，GEMM 变短了，all-reduce 和固定开销却没变，
# batch 64 时的比值反而更低。下一格读出这一轮在两种机器上各跑 3 次的记录（比值只在同一台机器内比较）。
#
# 同一份记录里还有 0.6B 形状的一课：之前 TP 下的 prefill 不走 CUDA graph，8192 个 token 的一步要从 Python 发几百个 kernel，
# rank 0 发 kernel 的速度赶不上 GPU 算的速度，GPU 大部分时间在等。现在 TP 下 prefill 也按 token bucket 捕获成 graph
# （piece 里的 all-reduce 一起被捕获：小 bucket 用 one-shot，大 bucket 用 NCCL），退出时先丢掉所有 graph 再离开进程组。

# %%
PROBE_DIR = os.path.join(os.pardir, "docs", "results", "2026-11-27", "tp_probes")
if os.path.isdir(PROBE_DIR):
    by_gpu = {}
    for name, gpu in (("call6_tp_bench_small_h100x2.json", "2 x H100"), ("call5_tp_bench_small_h200x2.json", "2 x H200")):
        with open(os.path.join(PROBE_DIR, name)) as f:
            by_gpu[gpu] = json.load(f)
    ratio = {gpu: {b: r["tp_bench"]["tp2_over_tp1"][f"batch{b}"] for b in (64, 256)} for gpu, r in by_gpu.items()}
    for gpu, per_batch in ratio.items():
        print(f"{gpu}: Qwen3-8B TP=2 / TP=1 = " + "; ".join(
            f"B={b}: {' / '.join(f'{x:.3f}' for x in per_batch[b]['ratio_per_run'])}" for b in (64, 256)))
    median = lambda gpu, b: ratio[gpu][b]["ratio_of_medians"]
    assert median("2 x H200", 64) < median("2 x H100", 64)      # 更快的显存：GEMM 变短，all-reduce 不变
    assert median("2 x H200", 64) < median("2 x H200", 256)     # batch 越大，固定开销摊得越薄
    # 0.6B 形状，profile 的那一个 prefill step 里 GPU 空等的时间（同一台机器上 TP=1 和 TP=2 比）
    for gpu, prefill in (("2 x H200", "eager"), ("2 x H100", "graphs")):
        idle = {tp: by_gpu[gpu]["small"][tp]["profile_prefill_batch64"]["gpu_idle"]["idle_ms_per_step"]
                for tp in ("tp1", "tp2")}
        print(f"{gpu}, 0.6B prefill step, TP=2 prefill {prefill}: GPU idle {idle['tp1']:.1f} ms at TP=1, "
              f"{idle['tp2']:.1f} ms at TP=2")
        if prefill == "eager":
            assert idle["tp2"] > 10 * idle["tp1"]
        else:
            assert idle["tp2"] < 2 * idle["tp1"]
else:
    print("没有 docs/results/（不是课程仓库）：这些记录见 docs/performance.md")

# %% [markdown]
# 第八次（`docs/performance.md` 的 "eighth stop"）终于找到了 Lamport 版本（数据自己当 flag）在引擎里卡死的原因。
# 它是一个经典的 read-modify-write race，值得单独讲：
#
# - 每个 program 有自己的 call number `epochs[pid]`。kernel 开头每个线程都 load 它、加 1，再由一个线程 store 回去，
#   load 和 store 之间什么都没有。
# - 带 norm 的 kernel 一个 program 有 16 个 warp。它们通常同时开始；但只要某个 warp 晚到几微秒，它 load 到的就已经是
#   加过 1 的值，于是算出相反的 parity：把自己那 1/16 行推到对方 buffer 的另一组 slot 里，也去自己 buffer 的另一组 slot 等数据。
# - 结果：两个 rank 都在等一段永远不会来的数据，30 s 后一起放弃。引擎 warm-up 里几百到一千多次调用才出现一次，
#   测试里上万次 graph replay 都没碰上。
#
# 修法是一行 `tl.debug_barrier()`：所有 warp 都读完旧值，才允许写新值。
# `tests/distributed/test_custom_all_reduce.py` 的 `test_every_warp_of_a_program_takes_the_same_call_number`
# 故意让 warp 1-3 晚到（一串相互依赖的 load），去掉 barrier 它就失败。两条教训：
#
# 1. Triton 里 "一个 program 的标量" 其实是每个线程各算一份；不同 warp 读写同一个地址，没有天然的先后。
# 2. 卡死之后再看现场没用：放弃等待的 reader 照样把 slot 清空，对方也继续往下跑。找到原因的办法是在协议承诺的每个点上
#    检查不变量（"我的第 e 次调用刚结束时，这一组 slot 里对方的那格一定是空的"），出事时让两边都立刻停下。
#
# 修好之后 fence 也去掉了（数据自己就是 flag，不需要 fence）。下一格读出修好之后的两次记录（都是两张 H200，每种 batch 3 次，
# 比值只在同一次调用里比）：call 4 和 call 7 用的代码几乎一样（call 7 只多了 wait 循环里"何时放弃"的统一判断），机器不同。

# %%
EIGHTH_DIR = os.path.join(os.pardir, "docs", "results", "2026-11-27", "tp_eighth_stop")
if os.path.isdir(EIGHTH_DIR):
    calls = {}
    for call, name in (("call 4", "call4_tp_bench_small_final_h200x2.json"), ("call 7", "call7_tp_bench_final_h200x2.json")):
        with open(os.path.join(EIGHTH_DIR, name)) as f:
            calls[call] = json.load(f)["tp_bench"]
    for call, bench in calls.items():
        assert bench["tp2"]["custom_error_flag"] == 0    # 没有一次等待放弃：比值量的是真正同步了的 all-reduce
        for batch in (64, 256):
            runs = bench["tp2_over_tp1"][f"batch{batch}"]["ratio_per_run"]
            print(f"{call}, B={batch:3d}: TP=2 / TP=1 = {' / '.join(f'{r:.3f}' for r in runs)}")
    profile = calls["call 4"]["tp2"]["profile_batch64"]
    share = profile["gpu_ms_per_step_by_band"]["all_reduce"] / profile["decode_step_ms_median"]
    print(f"call 4, TP=2, B=64: the 72 all-reduces take {share:.0%} of a decode step")
    ratios = lambda call, batch: calls[call]["tp2_over_tp1"][f"batch{batch}"]["ratio_per_run"]
    assert all(r < 1.6 for call in calls for r in ratios(call, 64))
    assert all(r >= 1.6 for r in ratios("call 4", 256)) and min(ratios("call 7", 256)) < 1.6
else:
    print("没有 docs/results/（不是课程仓库）：这些记录见 docs/performance.md")

# %% [markdown]
# batch 64 两次都差一点：剩下的是一半大小的 GEMM 照付的固定开销、72 次 all-reduce 和 kernel 之间的空隙，
# 都不是调一个常数就能拿掉的。batch 256 在 call 4 到了 1.6，在 call 7 却有两次没到：两次 GPU 上的 graph 一样长，
# 但 call 7 那台机器的 host 慢，rank 0 发一步 256 条序列的输入要 0.4–0.6 ms，TP=2 的 GPU 开始等 host。
# TP 把 GPU 上的活分成两半，host 上的活却一点没少（还多了发给 worker 的那一份），batch 越大这一份越重。

# %% [markdown]
# ## 4. Prefill/Decode 分离：把 KV 从一个进程搬到另一个进程
#
# 架构笔记里的设计：prefill 集群（算力密集）和 decode 集群（带宽密集、延迟敏感）分开部署，KV cache 在两者之间传递。
# `DisaggregatedLLM` 就是最小的版本：prefill 进程（rank 0）和 decode 进程（rank 1），两个都是普通的 `LLMEngine`。
#
# 每个请求的交接协议：
#
# 1. P → D（pipe）：header（token ids、sampling params、有 KV 的 token 数）；
# 2. D 用 **自己的** `BlockManager` 分配 block（prefix cache 命中的 block 不用传）；
# 3. D → P（pipe）：`("accept", first, last)`，或 `("defer",)`（D 没空间，P 稍后再试）；
# 4. P → D（`torch.distributed.send/recv`）：一个张量 `[2, layers, blocks, block_size, kv_heads, head_dim]`；
# 5. D 把它拷进自己的 block，`mark_computed`，放进 running 队列；P 释放自己的 block。

# %%
from reference.distributed.disaggregation import DisaggregatedLLM

pd_config = dict(device="auto", dtype="float32", kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256,
                 max_num_batched_tokens=256)
system = list(range(200, 232))                                  # 32 个 token 的共享 "system prompt"
pd_prompts = [system + list(range(300 + 20 * i, 300 + 20 * i + n)) for i, n in enumerate([3, 9, 17, 30, 45, 60])]
pd_params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

# more requests with their own prompts: only their KV transfer times are used (4.1 takes the fastest transfer)
timing_prompts = [list(range(700 + 40 * i, 700 + 40 * i + 20 + 3 * i)) for i in range(12)]

single = LLM(MODEL, **pd_config).generate(pd_prompts, pd_params, use_tqdm=False)
pd = DisaggregatedLLM(MODEL, **pd_config)
try:
    results = pd.generate(pd_prompts[:1], pd_params) + pd.generate(pd_prompts[1:], pd_params)
    timing_results = pd.generate(timing_prompts, pd_params)
    logs = pd.logs()
finally:
    pd.close()
same = [r["token_ids"] for r in results] == [o["token_ids"] for o in single]
print("分离部署的 token == 单引擎:", same)
assert same
received_all = [e for e in logs["decode"] if e["event"] == "KV_RECEIVED"]
received = received_all[:len(pd_prompts)]               # the six requests above, in the order they arrived
for e in received:
    print(f"KV_RECEIVED seq {e['seq_id']}: {e['blocks']} blocks, {e['bytes'] / 1024:5.0f} KiB, "
          f"{e['seconds'] * 1e3:.2f} ms, prefix 命中 {e['cached_blocks']} blocks")

# %% [markdown]
# **每个 token 的 KV 有多大**，从模型配置就能算出来：K 和 V 各一份，每层、每个 KV head 一个 `head_dim` 长的向量：
#
# **KV bytes / token = 2 × L × n_kv × d_head × dtype bytes**
#
# 传输按整 block 进行，所以一次传输的字节数应当正好是 `blocks × block_size × 每 token 字节数`。下面用配置算出的数字去核对每一次实测传输。

# %%
kv_per_token = 2 * tiny["num_hidden_layers"] * tiny["num_key_value_heads"] * tiny["head_dim"] * 4   # fp32
block_size = pd_config["kvcache_block_size"]
print(f"tiny model：每 token 的 KV = 2 × {tiny['num_hidden_layers']} × {tiny['num_key_value_heads']} × "
      f"{tiny['head_dim']} × 4 = {kv_per_token} 字节；一个 block = {kv_per_token * block_size} 字节")
assert all(e["bytes"] == e["blocks"] * block_size * kv_per_token for e in received)
# 共享的 32 token system prompt 是 2 个 block：第一个请求把它带到 decode 端，之后的请求都在 decode 端命中，不再传
shared_blocks = len(system) // block_size
assert [e["cached_blocks"] for e in received] == [0] + [shared_blocks] * (len(pd_prompts) - 1)
# decode 进程从不做 prefill：它的每一步都是 decode step（这正是分离的目的，decode 不再被 prefill 打断）
assert not any(e["is_prefill"] for e in logs["decode"] if e["event"] == "STEP")

# %% [markdown]
# 断言都成立：传输字节数和配置算出的完全一致；第一个请求把 32 token 的 system prompt（2 个 block）带到了 decode 端，
# 之后的请求在 decode 端的 prefix cache 里命中这 2 个 block，只传剩下的部分（`cached_blocks = 2`）；decode 进程一次 prefill 都没做。
# 下面画出每个请求的传输时间和字节数。

# %%
kv = [(r["kv_bytes"], r["kv_transfer_s"]) for r in results if r["kv_bytes"]]
plt.figure(figsize=(4.5, 3))
plt.scatter([b / 1024 for b, _ in kv], [s * 1e3 for _, s in kv])
plt.xlabel("KV bytes sent (KiB)")
plt.ylabel("transfer time (ms)")
plt.title("KV handoff, gloo on CPU")
plt.tight_layout()
plt.show()
ttft = [r["first_token_time"] - r["arrival_time"] for r in results]
print(f"TTFT（prefill 进程测得）中位数 {np.median(ttft) * 1e3:.1f} ms；"
      f"KV 传输中位数 {np.median([s for _, s in kv]) * 1e3:.2f} ms")

# %% [markdown]
# ### 4.1 分离什么时候划算
#
# 分离给每个请求 **加了** 一次 KV 传输（TTFT 之后、第一个 decode step 之前），换来的是 decode 不再被 prefill 打断
# （共置时一个长 prompt 的 prefill 步会让所有正在 decode 的请求多等一整步，见 Tutorial 07 的 chunked prefill）。
# 传输不拖慢系统的条件是：传一个 token 的 KV 比 prefill 算一个 token 快，这样 prefill 节点算下一个请求时，上一个请求的 KV
# 已经在路上，链路不成为瓶颈：
#
# **KV bytes / token ÷ 带宽 < prefill 每 token 的时间**，即 **带宽 > KV bytes / token ÷ prefill 每 token 的时间**
#
# 下面用本次运行实测的 prefill 步时间（prefill 进程 log 里 `STEP` 到同一步 `FIRST_TOKEN` 的时间）和实测的传输，
# 算出 tiny model 在 CPU 上的临界带宽和实测的有效带宽。

# %%
prefill_log = logs["prefill"]
step_start = {e["step"]: e["time"] for e in prefill_log if e["event"] == "STEP" and e["is_prefill"]}
step_tokens = {e["step"]: e["num_tokens"] for e in prefill_log if e["event"] == "STEP" and e["is_prefill"]}
step_end = {}
for e in prefill_log:
    if e["event"] == "FIRST_TOKEN" and e["step"] in step_start:
        step_end[e["step"]] = max(step_end.get(e["step"], 0.0), e["time"])
prefill_s = [step_end[s] - step_start[s] for s in step_start]
prefill_per_token = sum(prefill_s) / sum(step_tokens.values())
break_even = kv_per_token / prefill_per_token
achieved = sum(e["bytes"] for e in received) / sum(e["seconds"] for e in received)
print(f"prefill：{prefill_per_token * 1e6:.0f} µs / token → 临界带宽 {break_even / 1e6:.2f} MB/s")
print(f"实测 KV 传输：共 {sum(e['bytes'] for e in received)} 字节，有效带宽 {achieved / 1e6:.1f} MB/s")
transfer_s = [e["seconds"] for e in received_all]
print(f"每次传输 {min(transfer_s) * 1e3:.2f} ms（最快）/ {np.median(transfer_s) * 1e3:.2f} ms（中位数），"
      f"每个 prefill 步 {np.median(prefill_s) * 1e3:.1f} ms（中位数）")
assert min(transfer_s) < np.median(prefill_s)

# 同一个判据，换成课程在 H100 上记录的 Qwen3-0.6B 形状（bf16，28 层，8 个 KV head，head_dim 128）：
# prefill 每 token 的时间读自记录（docs/results/，docs/performance.md 的 session 6）
PREFILL_RUN = os.path.join(os.pardir, "docs", "results", "2026-11-25", "prefill_all.json")
small_kv_per_token = 2 * 28 * 8 * 128 * 2
if os.path.isfile(PREFILL_RUN):
    with open(PREFILL_RUN) as f:
        rec = json.load(f)
    small_prefill_per_token = rec["forward_and_logits_ms"] / 1e3 / rec["tokens"]
    need = small_kv_per_token / small_prefill_per_token
    print(f"Qwen3-0.6B 形状（H100 记录）：KV {small_kv_per_token // 1024} KiB / token，prefill "
          f"{small_prefill_per_token * 1e6:.2f} µs / token（{rec['tokens']} 个 token 一步）→ 临界带宽 {need / 1e9:.0f} GB/s")
    assert 25e9 < need < 400e9, "faster than RDMA's ~25 GB/s can carry, within NVLink's ~400 GB/s"
else:
    print("没有 docs/results/（不是课程仓库）：H100 上的 prefill 速度见 docs/performance.md 的 session 6")

# %% [markdown]
# 读数：断言保证的是，在 CPU 上最快的一次传输比一个 prefill 步（中位数）短。几 KiB 的 KV 本身微不足道，
# 传输时间主要是每次 send/recv 的固定开销（第一次还包括建链），所以实测的 "有效带宽" 很低。
# 为什么断言用最快的一次而不是中位数：一次传输要 P、D 两个进程同时被调度，机器一忙（别的程序占着核），
# 等调度的时间就算进了传输，中位数可能比 prefill 步还长；最快的那次最接近链路本身的开销。所以上面多发了 12 个请求，
# 只为多量几次传输：机器很忙时，6 次传输里可能一次快的都没有（见过最快 7.8 ms）。测延迟时这是通用的做法：
# 报中位数，判断 "机制本身多快" 时看最小值。再把实测的有效带宽和上面的临界带宽比一比：
# 有效带宽更高，传输就能被 prefill 盖住（这两个数在负载重的机器上会一起变，所以这里只打印、不断言）。
# 真实模型上 KV 是每 token 上百 KiB。课程在 H100 上记录的 Qwen3-0.6B 形状每 token 112 KiB，而它的 prefill 每 token 只要约 2.6 µs，
# 所以链路要约 44 GB/s 才跟得上 prefill（断言：在 25 到 400 GB/s 之间）：机间 RDMA（25 GB/s 量级）不够，机内 NVLink（数百 GB/s）够。
# 模型越小、prefill 越快，这个要求反而越高。
#
# 所以分离划算的条件是：（1）链路带宽高于临界带宽，传输能被下一次 prefill 盖住；（2）prefill 打断 decode 造成的 ITL 尖峰
# 是你在乎的指标（长 prompt、严格的 TPOT SLO）；（3）负载大到值得把两类节点分别扩容。反过来，短 prompt、宽松 SLO、
# 或者只有 PCIe / 以太网的慢链路上，共置加 chunked prefill 往往更简单也更快。GPU 上的测量见 `docs/performance.md`。

# %% [markdown]
# GPU 上的链路能给交接多少带宽？课程在两张 H200 上记录了引擎自己的交接函数（`post_send` 先把请求的 block gather 成一个张量再发，
# `post_receive` + `store` 收下再 scatter 进自己的 block），和同样字节数的 peer-to-peer 拷贝（链路本身）比
# （`docs/results/2026-11-27/tp_sixth_stop/`，命令见 `docs/performance.md` 的 "sixth stop"）。gather 和 scatter 是两次额外的显存拷贝，
# 和传输一个接一个地做，所以接收端看到的带宽只有链路的一部分；小请求更差，因为每次交接的固定开销（launch、NCCL 握手）不随字节数变小。
# 下一格读出记录：`words` 是现在的引擎（按 8 字节一个字拷贝 block，`kv_transfer.as_words`），`before` 是按 bf16 一个元素一个元素拷贝的旧版本。

# %%
KV_DIR = os.path.join(os.pardir, "docs", "results", "2026-11-27", "tp_sixth_stop")
if os.path.isdir(KV_DIR):
    kv_runs = {}
    for label, name in (("words", "call5_kvlink_wordson_1_h200x2.json"), ("before", "call5_kvlink_wordsoff_1_h200x2.json")):
        with open(os.path.join(KV_DIR, name)) as f:
            kv_runs[label] = json.load(f)["kvlink"]
    for blocks in ("10", "64", "256"):
        link = kv_runs["words"]["rank0"][blocks]["p2p_copy_GB_s"]
        got = {label: run["rank1"][blocks] for label, run in kv_runs.items()}
        print(f"{blocks:>3} blocks ({got['words']['bytes'] / 1e6:5.1f} MB): 接收端交接 words {got['words']['handoff_GB_s']:5.1f} GB/s, "
              f"before {got['before']['handoff_GB_s']:5.1f} GB/s；链路（peer copy）{link:5.1f} GB/s")
        assert got["words"]["handoff_GB_s"] < link              # 多两次拷贝，交接永远追不上链路
    small, large = kv_runs["words"]["rank1"]["10"], kv_runs["words"]["rank1"]["256"]
    assert small["handoff_GB_s"] < large["handoff_GB_s"] / 2    # 小请求：固定开销占大头
    assert large["handoff_GB_s"] > 1.5 * kv_runs["before"]["rank1"]["256"]["handoff_GB_s"]   # 按字拷贝：大请求快了
    # 8B 形状每 token 的 KV（练习 1 的公式），按中位数请求的交接带宽传一个 token 要多久
    per_token_8b = 36 * 8 * 128 * 2 * 2
    print(f"Qwen3-8B：每 token {per_token_8b // 1024} KiB，按 {small['handoff_GB_s']:.0f} GB/s 传一个 token "
          f"{per_token_8b / (small['handoff_GB_s'] * 1e9) * 1e6:.1f} µs")
else:
    print("没有 docs/results/（不是课程仓库）：这些记录见 docs/performance.md")

# %% [markdown]
# 读数：即使是最慢的小请求（10 个 block，约 24 MB），8B 形状一个 token 的 KV 也只要几 µs 就传完，而 8B 在 H100 上 prefill 一个 token
# 要约 21 µs（`docs/performance.md`），所以机内 NVLink 上的分离不会被链路卡住。想让交接接近链路，要去掉那两次拷贝：
# 例如按连续的 block 段直接发，或者让 gather 和发送合成一步。这是留给你的思考题。

# %% [markdown]
# ## 课堂练习
#
# **练习 1.** Qwen3-8B（bf16，36 层，8 个 KV head，head_dim 128）一个 2000 token 的 prompt，prefill 之后要传多少字节的 KV？
# 以 25 GB/s（跨机 RDMA 量级）和 400 GB/s（NVLink 量级）分别要多久？和它的 decode TPOT（约 10 ms 量级）比一比。
#
# **练习 2.** `num_key_value_heads = 8` 的模型，`tensor_parallel_size` 可以取哪些值？为什么 `Config` 在 `8 % N != 0` 时直接报错，
# 而不是让某些 rank 多拿一个 head？（提示：每个 rank 的 KV cache 形状、block table 必须一致。）

# %%
# 在这里写你的答案


# %% [markdown answer]
# ### 参考答案

# %% [answer]
# 练习 1：每 token 的 KV = 层数 × KV heads × head_dim × 2（K、V）× 2 字节
per_token = 36 * 8 * 128 * 2 * 2
total = 2000 * per_token
for name, bandwidth in [("25 GB/s", 25e9), ("400 GB/s", 400e9)]:
    print(f"{total / 2**20:.0f} MiB at {name}: {total / bandwidth * 1e3:.2f} ms")
assert per_token == 147456

# 练习 2：N 必须整除 8（1、2、4、8），否则 rank 之间 KV head 数不同，KV cache 形状不同。
# 下面用 tiny model（2 个 KV head）演示同一条规则：只有 1、2 可以。
from reference.config import Config

for n in (1, 2, 3, 4):
    try:
        Config(MODEL, device="cpu", tensor_parallel_size=n)
        print(f"N={n}: ok")
    except ValueError as err:
        print(f"N={n}: {err}")
