"""The built-in tiny model: a random-weight Qwen3 checkpoint that anyone can build offline.

Why this exists: every exercise in the course needs *a* model in real Hugging Face format,
but students may have no GPU, no network and no Hub account.  This module builds one from
nothing in a fraction of a second (once torch and transformers are imported): it trains a small byte-level BPE tokenizer on an embedded
Chinese/English corpus, creates a 2-layer Qwen3 with seeded random weights, and saves
both with ``save_pretrained``.  The result loads with ``AutoModelForCausalLM`` and
``AutoTokenizer`` like any downloaded checkpoint, so the reference engine can be checked
token-for-token against transformers.

The weights are random, so the model's text is gibberish; what matters is that it is a
deterministic function of the seed and that greedy decoding is well conditioned (the top
two logits are rarely close, see ``INITIALIZER_RANGE``).

Heavy libraries (torch, transformers, tokenizers) are imported inside the functions that
need them, so that ``ensure_tiny_model`` on an existing cache, or ``default_model_dir``,
costs no more than a few ``stat`` calls.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    import tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_MODEL_NAME",
    "ENDOFTEXT_TOKEN",
    "EOS_TOKEN",
    "IM_END_TOKEN",
    "IM_START_TOKEN",
    "INITIALIZER_RANGE",
    "MARKER_FILE",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "TINY_CONFIG",
    "TINY_CORPUS",
    "TINY_MODEL_FORMAT_VERSION",
    "default_model_dir",
    "ensure_tiny_model",
    "make_tiny_model",
]

# ---------------------------------------------------------------------------------------
# Constants (cited by the docs; change them only together with TINY_MODEL_FORMAT_VERSION)
# ---------------------------------------------------------------------------------------

TINY_MODEL_FORMAT_VERSION: Final[int] = 1
"""Bumped whenever the corpus, tokenizer recipe, shape or init changes.

A cached folder whose marker carries another version is rebuilt by ``ensure_tiny_model``,
so students never keep using a stale model after upgrading InferLab.
"""

ENDOFTEXT_TOKEN: Final[str] = "<|endoftext|>"
IM_START_TOKEN: Final[str] = "<|im_start|>"
IM_END_TOKEN: Final[str] = "<|im_end|>"
SPECIAL_TOKENS: Final[tuple[str, ...]] = (ENDOFTEXT_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
"""Appended after the learned BPE vocabulary, in this order, as Qwen does."""

EOS_TOKEN: Final[str] = IM_END_TOKEN
"""A chat turn ends with ``<|im_end|>``, so that is where generation stops."""

PAD_TOKEN: Final[str] = ENDOFTEXT_TOKEN
"""Padding never reaches the model's attention, so reusing end-of-text is harmless."""

BPE_VOCAB_SIZE: Final[int] = 1021
"""Learned tokens (256 byte symbols + 765 merges); with the 3 specials the vocab is 1024."""

BPE_MIN_FREQUENCY: Final[int] = 2
"""A pair must occur twice to be merged, so the vocabulary is not full of one-off words."""

INITIALIZER_RANGE: Final[float] = 0.2
"""Standard deviation of every random weight matrix (norm weights are exactly 1).

Why 0.2 and not the usual 0.02: the embeddings are tied, so at a small scale the residual
stream is dominated by the input token's own embedding and greedy decoding just repeats
the last prompt token forever.  At 0.2 the layers outweigh the embedding, greedy outputs
vary, and the logits spread enough (std about 1.6) that the top-1/top-2 gap is almost
always thousands of times larger than float32 rounding noise.  Larger values would widen
the gap further but make the softmax so peaked that sampling exercises become boring.
"""

_VOCAB_SIZE: Final[int] = BPE_VOCAB_SIZE + len(SPECIAL_TOKENS)

TINY_CONFIG: Final[Mapping[str, Any]] = {
    "vocab_size": _VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "initializer_range": INITIALIZER_RANGE,
    "hidden_act": "silu",
    "attention_bias": False,
    "dtype": "float32",
    # Special ids follow from appending SPECIAL_TOKENS after the BPE vocabulary;
    # make_tiny_model checks that the trained tokenizer agrees.
    "bos_token_id": BPE_VOCAB_SIZE + SPECIAL_TOKENS.index(ENDOFTEXT_TOKEN),
    "pad_token_id": BPE_VOCAB_SIZE + SPECIAL_TOKENS.index(PAD_TOKEN),
    "eos_token_id": BPE_VOCAB_SIZE + SPECIAL_TOKENS.index(EOS_TOKEN),
}
"""Shape and token ids of the tiny model, in plain numbers so documentation can cite them.

Note that transformers 5 stores ``rope_theta`` inside ``rope_parameters`` in config.json.
"""

CHAT_TEMPLATE: Final[str] = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
"""Plain ChatML: the same turn markers as Qwen, without Qwen3's tool and thinking extras."""

DEFAULT_MODEL_NAME: Final[str] = "tiny-qwen3-seed0"
"""Folder name of the default (seed 0) model inside the cache; other seeds use their number."""
MARKER_FILE: Final[str] = "inferlab_tiny_model.json"
"""Written last by ``make_tiny_model``; its presence and content define a complete build."""

_REQUIRED_FILES: Final[tuple[str, ...]] = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
_TEMP_INFIX: Final[str] = ".tmp-"
_STALE_INFIX: Final[str] = ".stale-"

TINY_CORPUS: Final[str] = """\
Serving a language model has two phases. During prefill the engine reads the whole prompt in one pass and fills the KV cache; during decode it produces one new token per step.
Prefill is usually limited by compute, because every prompt token passes through every matrix multiplication at once.
Decode is usually limited by memory bandwidth: each step loads all the weights to produce a single token for each sequence.
The KV cache stores the keys and values of earlier tokens so that attention never has to recompute them.
Without a KV cache, generating the hundredth token would repeat the work for the first ninety-nine tokens.
A paged KV cache splits memory into fixed-size blocks, much like pages in an operating system.
A block table maps the logical positions of a sequence to the physical blocks that hold its keys and values.
When two requests share the same system prompt, prefix caching lets them reuse the same cached blocks.
A hash of the token ids in each full block is a cheap way to find a block that was computed before.
Batching several requests together turns many thin matrix-vector products into one fat matrix-matrix product.
Static batching waits until the whole batch is finished; continuous batching admits new requests at every step.
The scheduler decides which requests run in the next step, how many prompt tokens to prefill, and when to preempt.
If the cache runs out of free blocks, the scheduler may preempt a request and recompute it later.
Chunked prefill cuts a long prompt into pieces so that decode steps of other requests are not stalled.
Time to first token measures how long a user waits before the answer starts to appear.
Time per output token measures how fast the rest of the answer streams out.
Throughput counts how many tokens the whole system produces per second across all users.
Latency and throughput pull in opposite directions: bigger batches raise throughput but may slow each request.
Greedy decoding always picks the token with the highest logit; sampling draws from the softmax distribution instead.
Temperature divides the logits before the softmax; a low temperature makes the model more confident.
Top-k keeps only the k most likely tokens, and top-p keeps the smallest set whose probability reaches p.
Rotary position embeddings rotate each query and key by an angle that depends on its position.
Grouped-query attention lets several query heads share one key head and one value head, which shrinks the cache.
RMSNorm rescales a vector by the root mean square of its entries and then applies a learned gain.
The attention kernel reads queries for the new tokens and keys and values for the whole context.
FlashAttention tiles the computation so that the full attention matrix never has to live in slow memory.
CUDA graphs record a sequence of kernel launches once and replay it cheaply at every decode step.
Tensor parallelism splits each weight matrix across several GPUs and joins the partial results with all-reduce.
Pipeline parallelism places different layers on different devices and passes activations between them.
Quantization stores weights in eight or four bits so that more of the model fits in fast memory.
Speculative decoding lets a small draft model guess several tokens that the large model then verifies in one pass.
The tokenizer turns text into integer ids, and the detokenizer turns ids back into text.
A chat template wraps each message with role markers such as system, user and assistant.
The engine stops a sequence when it emits the end-of-sequence token or reaches the maximum length.
Measure before you optimize: a profiler shows where the time really goes.
system: You are a patient tutor who explains LLM inference step by step.
user: Why is decode slower per token than prefill?
assistant: Because each decode step reads every weight to produce only one token per sequence.
user: What does the KV cache save?
assistant: It saves recomputing the keys and values of all earlier tokens at every step.
system: 你是一名耐心的助教，负责讲解大语言模型推理。
user: 为什么解码比预填充慢？
assistant: 因为每个解码步骤都要读取全部权重，却只为每个序列生成一个词元。
user: 键值缓存节省了什么？
assistant: 它避免了在每一步重新计算之前所有词元的键和值。
大语言模型的推理分为两个阶段：预填充阶段一次性处理整个提示词，解码阶段每一步只生成一个新词元。
预填充通常受限于算力，因为所有提示词元会同时经过每一次矩阵乘法。
解码通常受限于显存带宽，每一步都要把全部权重读一遍，却只为每个序列产生一个词元。
键值缓存保存了之前词元的键和值，这样注意力计算就不必重复处理历史内容。
如果没有键值缓存，生成第一百个词元时就要把前面九十九个词元重新算一遍。
分页键值缓存把显存切成固定大小的块，就像操作系统里的内存分页。
块表记录了一个序列的逻辑位置对应哪些物理块。
当两个请求共享同一个系统提示词时，前缀缓存可以让它们复用已经算好的块。
对每个满块中的词元编号求哈希，是查找已计算块的一种低成本方法。
把多个请求放在一起批处理，可以把许多细长的矩阵向量乘法合并成一次矩阵乘法。
静态批处理要等整批请求全部结束；连续批处理在每一步都可以加入新的请求。
调度器决定下一步运行哪些请求、预填充多少提示词元，以及何时抢占。
当缓存中没有空闲块时，调度器可能会抢占某个请求，稍后再重新计算。
分块预填充把很长的提示词切成几段，避免其他请求的解码步骤被长时间阻塞。
首词元延迟衡量用户从发出请求到看到第一个字需要等多久。
每个输出词元的时间衡量后续回答流式输出的速度。
吞吐量统计整个系统每秒为所有用户生成多少个词元。
延迟和吞吐量往往相互制约：更大的批次能提高吞吐量，但可能让单个请求变慢。
贪心解码总是选择得分最高的词元；采样则根据概率分布随机抽取。
温度会在归一化之前缩放得分，温度越低，模型的输出越确定。
前k采样只保留概率最高的k个词元，前p采样保留累计概率达到p的最小集合。
旋转位置编码按照位置把每个查询向量和键向量旋转一个角度。
分组查询注意力让多个查询头共享同一组键头和值头，从而减小缓存。
均方根归一化用向量元素的均方根来缩放向量，再乘以可学习的增益。
注意力算子读取新词元的查询，以及整个上下文的键和值。
闪电注意力把计算切成小块，完整的注意力矩阵不必放进慢速显存。
计算图捕获会把一串内核启动录制下来，在每个解码步骤中低开销地重放。
张量并行把每个权重矩阵切分到多块显卡上，再用全归约合并部分结果。
流水线并行把不同的层放在不同的设备上，并在设备之间传递激活值。
量化用八位或四位整数存储权重，让更多模型参数放进高速显存。
投机解码让一个小的草稿模型先猜出几个词元，再由大模型一次性验证。
分词器把文本变成整数编号，反分词器再把编号变回文本。
对话模板用系统、用户和助手等角色标记包裹每一条消息。
当序列生成结束符或达到最大长度时，推理引擎就会停止这个序列。
先测量，再优化：性能分析工具会告诉你时间究竟花在了哪里。
推理引擎、调度器、键值缓存和批处理共同决定了服务的成本与体验。
"""
"""Original bilingual sentences about LLM inference; the only training data of the tokenizer.

It is small on purpose (about 8 KB): training takes a fraction of a second, yet common
words in both languages (prefill, decode, 缓存, 词元, ...) become single tokens, which makes
tokenization demos in class readable.
"""


# ---------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------


def _check_seed(seed: int) -> int:
    """Reject seeds that torch would silently reinterpret, so seed N always means one model."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return seed


def _train_bpe() -> tokenizers.Tokenizer:
    """Train the byte-level BPE on ``TINY_CORPUS`` and append the special tokens.

    Byte-level means every possible input byte has a token, so any UTF-8 text (emoji,
    rare Chinese characters) encodes and decodes exactly, even if the corpus never saw it.
    The trainer is deterministic for a fixed corpus, which keeps tokenizer.json stable.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=BPE_MIN_FREQUENCY,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(TINY_CORPUS.splitlines(), trainer=trainer)
    if tokenizer.get_vocab_size() != BPE_VOCAB_SIZE:
        # A shorter corpus could run out of pairs to merge; fail loudly rather than
        # quietly shifting every special-token id that TINY_CONFIG promises.
        raise RuntimeError(
            f"BPE training produced {tokenizer.get_vocab_size()} tokens, expected {BPE_VOCAB_SIZE}"
        )
    tokenizer.add_special_tokens(
        [AddedToken(text, special=True, normalized=False) for text in SPECIAL_TOKENS]
    )
    return tokenizer


def _build_hf_tokenizer() -> PreTrainedTokenizerFast:
    """Wrap the trained BPE as a transformers tokenizer with ChatML and EOS/pad settings.

    In transformers 5 ``PreTrainedTokenizerFast`` is an alias of ``TokenizersBackend``;
    saving it records that class name in tokenizer_config.json, so ``AutoTokenizer``
    reloads tokenizer.json verbatim instead of rebuilding a Qwen2Tokenizer pipeline
    (which would impose Qwen's own pre-tokenizer regex and NFC normalizer).
    """
    from transformers import PreTrainedTokenizerFast

    backend = _train_bpe()
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TINY_CONFIG["max_position_embeddings"],
        # 4.x would otherwise strip the space in " ." on decode; 5.x skips that for BPE.
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    expected = {
        "bos_token_id": ENDOFTEXT_TOKEN,
        "pad_token_id": PAD_TOKEN,
        "eos_token_id": EOS_TOKEN,
    }
    for key, token in expected.items():
        token_id = hf_tokenizer.convert_tokens_to_ids(token)
        if token_id != TINY_CONFIG[key]:
            raise RuntimeError(f"{token} got id {token_id}, TINY_CONFIG says {TINY_CONFIG[key]}")
    if len(hf_tokenizer) != TINY_CONFIG["vocab_size"]:
        raise RuntimeError(f"tokenizer has {len(hf_tokenizer)} tokens, expected {_VOCAB_SIZE}")
    return hf_tokenizer


def _build_model(seed: int) -> Qwen3ForCausalLM:
    """Create the float32 Qwen3 and fill every parameter from a private seeded generator.

    Why explicit init instead of relying on transformers' ``_init_weights``: that routine
    may change between releases, and it draws from the global RNG.  Drawing each tensor,
    in sorted-name order, from our own ``torch.Generator`` makes the weights a function of
    the seed alone and leaves the caller's global random state untouched.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=TINY_CONFIG["vocab_size"],
        hidden_size=TINY_CONFIG["hidden_size"],
        intermediate_size=TINY_CONFIG["intermediate_size"],
        num_hidden_layers=TINY_CONFIG["num_hidden_layers"],
        num_attention_heads=TINY_CONFIG["num_attention_heads"],
        num_key_value_heads=TINY_CONFIG["num_key_value_heads"],
        head_dim=TINY_CONFIG["head_dim"],
        hidden_act=TINY_CONFIG["hidden_act"],
        max_position_embeddings=TINY_CONFIG["max_position_embeddings"],
        # transformers 5 folds this into rope_parameters={"rope_type": "default", ...};
        # 4.x keeps it top-level.  Passing it this way works with both.
        rope_theta=TINY_CONFIG["rope_theta"],
        rms_norm_eps=TINY_CONFIG["rms_norm_eps"],
        tie_word_embeddings=TINY_CONFIG["tie_word_embeddings"],
        initializer_range=TINY_CONFIG["initializer_range"],
        attention_bias=TINY_CONFIG["attention_bias"],
        bos_token_id=TINY_CONFIG["bos_token_id"],
        pad_token_id=TINY_CONFIG["pad_token_id"],
        eos_token_id=TINY_CONFIG["eos_token_id"],
    )
    # Construction runs transformers' own init on the global RNG; fork it so that
    # building a model never changes what the caller's torch.randn returns next.
    with torch.random.fork_rng(devices=[]):
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.float32).eval()

    generator = torch.Generator(device="cpu").manual_seed(seed)
    norm_weights = {
        f"{module_name}.weight" if module_name else "weight"
        for module_name, module in model.named_modules()
        if type(module).__name__.endswith("RMSNorm")
    }
    with torch.no_grad():
        # named_parameters() yields a tied tensor once, so the shared embedding /
        # lm_head matrix is drawn exactly once.
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if name in norm_weights:
                param.fill_(1.0)  # a random gain would hide bugs in the engine's RMSNorm
            else:
                param.normal_(mean=0.0, std=INITIALIZER_RANGE, generator=generator)

    model.generation_config = GenerationConfig(
        bos_token_id=TINY_CONFIG["bos_token_id"],
        eos_token_id=TINY_CONFIG["eos_token_id"],
        pad_token_id=TINY_CONFIG["pad_token_id"],
        do_sample=False,
    )
    return model


def _save_model_quietly(model: Qwen3ForCausalLM, out_dir: pathlib.Path) -> None:
    """Save with ``save_pretrained`` but without its per-shard progress bar.

    transformers 5 always writes safetensors (the ``safe_serialization`` switch is gone)
    and draws a tqdm bar even for a single 650 KB shard, which clutters test and CLI output.
    """
    from transformers.utils import logging as hf_logging

    bar_was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out_dir)
    finally:
        if bar_was_enabled:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def make_tiny_model(out_dir: str | os.PathLike[str], seed: int = 0) -> pathlib.Path:
    """Write a complete Hugging Face-format tiny Qwen3 model folder and return its path.

    The folder holds config.json, generation_config.json, model.safetensors, the tokenizer
    files transformers writes (tokenizer.json, tokenizer_config.json, chat_template.jinja)
    and, last of all, ``MARKER_FILE``.  The same seed always gives byte-identical files;
    the tokenizer does not depend on the seed.  Files already in ``out_dir`` are
    overwritten; use ``ensure_tiny_model`` for an atomic, cached build.
    """
    seed = _check_seed(seed)
    out_path = pathlib.Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    # Drop an old marker first: if this build dies halfway, the folder must not claim
    # to be complete on the strength of a previous build's marker.
    (out_path / MARKER_FILE).unlink(missing_ok=True)

    tokenizer = _build_hf_tokenizer()
    tokenizer.save_pretrained(out_path)
    model = _build_model(seed)
    _save_model_quietly(model, out_path)

    marker = {
        "builder": "courseware.tiny_model",
        "format_version": TINY_MODEL_FORMAT_VERSION,
        "seed": seed,
        # Sizes let a cheap check notice a truncated or replaced file.
        "files": {name: (out_path / name).stat().st_size for name in _REQUIRED_FILES},
    }
    (out_path / MARKER_FILE).write_text(
        json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return out_path


def default_model_dir(seed: int = 0) -> pathlib.Path:
    """Return where the cached tiny model for ``seed`` lives (``tiny-qwen3-seed0`` by default).

    ``$INFERLAB_CACHE`` wins so that CI and classroom machines can point every student at
    a shared or scratch disk; otherwise the per-user ``~/.cache/inferlab`` is used.
    """
    seed = _check_seed(seed)
    cache_root = os.environ.get("INFERLAB_CACHE")
    base = pathlib.Path(cache_root).expanduser() if cache_root else pathlib.Path.home() / ".cache" / "inferlab"
    return base / f"tiny-qwen3-seed{seed}"


def _read_marker(path: pathlib.Path) -> dict[str, Any] | None:
    """Return the build marker in ``path``, or None when absent or unreadable.

    An unreadable marker is treated like a missing one: the folder then counts as
    not ours, and ``ensure_tiny_model`` refuses to touch it rather than guess.
    """
    try:
        data = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("builder") != "courseware.tiny_model":
        return None
    return data


def _is_complete(path: pathlib.Path, seed: int) -> bool:
    """Tell whether ``path`` holds a finished, current build for ``seed``.

    Checked without importing torch: marker present with this format version and seed,
    and every required file present with the size the marker recorded.
    """
    marker = _read_marker(path)
    if marker is None:
        return False
    if marker.get("format_version") != TINY_MODEL_FORMAT_VERSION or marker.get("seed") != seed:
        return False
    sizes = marker.get("files")
    if not isinstance(sizes, dict):
        return False
    for name in _REQUIRED_FILES:
        try:
            if (path / name).stat().st_size != sizes.get(name):
                return False
        except OSError:
            return False
    return True


def _install(built: pathlib.Path, target: pathlib.Path, seed: int) -> None:
    """Move a finished build into place with renames, never exposing a partial folder.

    An outdated build of ours at ``target`` is first renamed aside, then removed.  If
    another process installs a complete model while we work, its copy is kept: it is
    byte-identical to ours by construction.
    """
    if _is_complete(target, seed):
        return
    stale: pathlib.Path | None = None
    if target.exists():
        stale = target.with_name(f".{target.name}{_STALE_INFIX}{uuid.uuid4().hex}")
        try:
            os.rename(target, stale)
        except FileNotFoundError:  # someone else moved it first
            stale = None
    try:
        os.rename(built, target)
    except OSError:
        if not _is_complete(target, seed):
            raise
    finally:
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)


def ensure_tiny_model(path: str | os.PathLike[str] | None = None, seed: int = 0) -> pathlib.Path:
    """Return a folder holding the tiny model for ``seed``, building it there if needed.

    ``path`` defaults to ``default_model_dir(seed)``.  A complete build is reused as is, so
    the second call is just a few ``stat`` calls.  A missing, damaged or outdated build
    of ours is (re)built in a temporary sibling folder and renamed into place, so an
    interrupted build leaves at most a hidden ``.<name>.tmp-*`` folder that is never
    mistaken for the model.

    Raises:
        ValueError: ``path`` holds a tiny model built with a different seed (silently
            replacing it would change the results of whoever put it there).
        FileExistsError: ``path`` is a non-empty folder (or a file) that this module did
            not create; it is left untouched.
    """
    seed = _check_seed(seed)
    target = pathlib.Path(path).expanduser() if path is not None else default_model_dir(seed)
    if _is_complete(target, seed):
        return target

    marker = _read_marker(target)
    if marker is not None and marker.get("seed") != seed:
        raise ValueError(f"{target} holds the tiny model for seed {marker.get('seed')}, not {seed}")
    if marker is None and target.exists():
        if not target.is_dir() or any(target.iterdir()):
            raise FileExistsError(f"{target} exists and is not an InferLab tiny model; not touching it")

    target.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its 0700 mode would survive the rename and lock other users
    # out of a shared $INFERLAB_CACHE.  A random suffix keeps concurrent builders apart.
    building = target.with_name(f".{target.name}{_TEMP_INFIX}{uuid.uuid4().hex}")
    building.mkdir()
    try:
        make_tiny_model(building, seed=seed)
        _install(building, target, seed)
    finally:
        # After a successful rename this path no longer exists; after a failure it
        # holds the partial build, which nobody should see.
        shutil.rmtree(building, ignore_errors=True)
    return target
