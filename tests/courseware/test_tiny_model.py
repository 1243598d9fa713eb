"""Tests for the built-in tiny model: determinism, offline loading, tokenizer and the cache.

Everything here runs on CPU in a few seconds; each build of the tiny model takes well
under a second once torch and transformers are imported.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
from collections.abc import Iterator

import pytest
import torch
import transformers
from safetensors.torch import load_file

from courseware import tiny_model as tm

EXPECTED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    tm.MARKER_FILE,
)

ROUND_TRIP_TEXTS = [
    "Prefill fills the KV cache; decode adds one token per step.",
    "预填充阶段填满键值缓存，解码阶段每步生成一个词元。",
    "Mixed 混合: continuous batching 连续批处理 + paged KV cache 分页缓存!",
    "  leading spaces, trailing spaces  ",
    "Spaces before punctuation survive : a , b . c ! d ? it 's , do n't",
    "tabs\tand\nnewlines\r\n and  double  spaces",
    "Never seen by the corpus: 饕餮, Ωμέγα, émoji 🙂🚀, 12345.678",
    "",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """One seed-0 build shared by the read-only tests, to keep the module fast."""
    return tm.make_tiny_model(tmp_path_factory.mktemp("tiny") / "seed0", seed=0)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any attempt to reach the network fail loudly.

    huggingface_hub reads HF_HUB_OFFLINE once at import, so the env var alone would not
    bite in a process that already imported it; patch the constant and sockets too.
    """
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network access attempted while loading the tiny model offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def build_counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count real builds made through ensure_tiny_model (the list holds seeds built)."""
    calls: list[int] = []
    real_builder = tm.make_tiny_model

    def counting_builder(out_dir: str | os.PathLike[str], seed: int = 0) -> pathlib.Path:
        calls.append(seed)
        return real_builder(out_dir, seed=seed)

    monkeypatch.setattr(tm, "make_tiny_model", counting_builder)
    yield calls


def load_tokenizer(path: pathlib.Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(path)


# ---------------------------------------------------------------------------------------
# The build itself
# ---------------------------------------------------------------------------------------


def test_build_writes_a_complete_hf_folder(model_dir: pathlib.Path) -> None:
    missing = [name for name in EXPECTED_FILES if not (model_dir / name).is_file()]
    assert not missing, f"missing files: {missing}"
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tm.TINY_CONFIG["eos_token_id"]
    assert generation["pad_token_id"] == tm.TINY_CONFIG["pad_token_id"]


def test_same_seed_gives_identical_files(model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    again = tm.make_tiny_model(tmp_path / "again", seed=0)
    for name in EXPECTED_FILES:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
    first, second = load_file(model_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_different_seed_gives_different_weights(model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    other = tm.make_tiny_model(tmp_path / "seed1", seed=1)
    first, second = load_file(model_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        if key.endswith("norm.weight"):
            assert torch.equal(first[key], second[key]), key  # both exactly one
        else:
            assert not torch.equal(first[key], second[key]), f"{key} did not change with the seed"
    # The tokenizer is seed-independent by design.
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_weights_have_the_documented_shape_and_init(model_dir: pathlib.Path) -> None:
    cfg = tm.TINY_CONFIG
    weights = load_file(model_dir / "model.safetensors")
    assert "lm_head.weight" not in weights, "tied embeddings must be stored once"
    embed = weights["model.embed_tokens.weight"]
    assert embed.shape == (cfg["vocab_size"], cfg["hidden_size"])
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (heads * head_dim, cfg["hidden_size"])
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (kv_heads * head_dim, cfg["hidden_size"])
    assert weights["model.layers.0.mlp.gate_proj.weight"].shape == (cfg["intermediate_size"], cfg["hidden_size"])
    layers = {key.split(".")[2] for key in weights if key.startswith("model.layers.")}
    assert len(layers) == cfg["num_hidden_layers"]
    for key, tensor in weights.items():
        assert tensor.dtype == torch.float32, key
        if key.endswith("norm.weight"):
            assert torch.equal(tensor, torch.ones_like(tensor)), f"{key} must be exactly 1"
        else:
            assert abs(tensor.std().item() - tm.INITIALIZER_RANGE) < 0.2 * tm.INITIALIZER_RANGE, key


def test_building_leaves_the_global_rng_alone(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    tm.make_tiny_model(tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_seed_is_refused(tmp_path: pathlib.Path, seed: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        tm.make_tiny_model(tmp_path / "m", seed=seed)  # type: ignore[arg-type]
    assert not (tmp_path / "m" / tm.MARKER_FILE).exists()


# ---------------------------------------------------------------------------------------
# Loading with transformers, offline
# ---------------------------------------------------------------------------------------


def test_loads_offline_with_auto_classes(model_dir: pathlib.Path, offline: None) -> None:
    cfg = tm.TINY_CONFIG
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim",
                "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                "eos_token_id", "pad_token_id", "bos_token_id"):
        assert getattr(model.config, key) == cfg[key], key
    rope = getattr(model.config, "rope_parameters", None) or {}
    assert rope.get("rope_theta", getattr(model.config, "rope_theta", None)) == cfg["rope_theta"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.generation_config.eos_token_id == cfg["eos_token_id"]
    # Loading must use the saved weights, not re-initialise any of them.
    saved = load_file(model_dir / "model.safetensors")
    state = model.state_dict()
    assert all(torch.equal(state[key], saved[key]) for key in saved)

    tokenizer = load_tokenizer(model_dir)
    assert len(tokenizer) == cfg["vocab_size"] == model.config.vocab_size
    assert tokenizer.eos_token == tm.EOS_TOKEN == "<|im_end|>"
    assert tokenizer.eos_token_id == cfg["eos_token_id"]
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id == cfg["pad_token_id"]


# ---------------------------------------------------------------------------------------
# Tokenizer and chat template
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenizer_round_trips_text_exactly(model_dir: pathlib.Path, text: str) -> None:
    from tokenizers import Tokenizer

    hf_tokenizer = load_tokenizer(model_dir)
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert hf_tokenizer.decode(ids) == text
    assert all(0 <= i < tm.BPE_VOCAB_SIZE for i in ids), "plain text must not produce special ids"
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.encode(text).ids == ids, "tokenizer.json alone must tokenize like AutoTokenizer"
    assert raw.decode(ids) == text


@pytest.mark.parametrize("word", [" prefill", " decode", " cache", "键值缓存", "词元", "预填充", "user", "assistant"])
def test_corpus_words_became_single_tokens(model_dir: pathlib.Path, word: str) -> None:
    tokenizer = load_tokenizer(model_dir)
    assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, tokenizer.tokenize(word)


def test_vocab_size_and_special_token_ids(model_dir: pathlib.Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    assert tm.TINY_CONFIG["vocab_size"] == len(tokenizer)
    assert 1000 <= len(tokenizer) <= 2000
    for offset, special in enumerate(tm.SPECIAL_TOKENS):
        assert tokenizer.encode(special, add_special_tokens=False) == [tm.BPE_VOCAB_SIZE + offset]
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)


def test_chat_template_renders_chatml(model_dir: pathlib.Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "你好"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n"

    conversation = [
        {"role": "system", "content": "You are a tutor."},
        {"role": "user", "content": "What is decode?"},
        {"role": "assistant", "content": "One token per step."},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nYou are a tutor.<|im_end|>\n"
        "<|im_start|>user\nWhat is decode?<|im_end|>\n"
        "<|im_start|>assistant\nOne token per step.<|im_end|>\n"
    )
    assert (model_dir / "chat_template.jinja").read_text() == tm.CHAT_TEMPLATE


def test_tokenized_chat_template_ends_with_generation_prompt(model_dir: pathlib.Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    messages = [{"role": "user", "content": "What does the KV cache save?"}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 returns a BatchEncoding here; 4.x returned a plain list of ids.
    ids = encoded["input_ids"] if isinstance(encoded, transformers.BatchEncoding) else encoded
    start, end = tm.TINY_CONFIG["bos_token_id"] + 1, tm.TINY_CONFIG["eos_token_id"]
    assert ids[0] == start
    assert ids.count(end) == 1
    tail = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[-len(tail):] == tail
    assert tokenizer.decode(ids).endswith("<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------
# Numerical conditioning (the engine tests compare greedy tokens with transformers)
# ---------------------------------------------------------------------------------------


def test_greedy_decoding_is_varied_and_far_from_ties(model_dir: pathlib.Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    generator = torch.Generator().manual_seed(99)
    gaps: list[float] = []
    for length in (3, 9, 17, 33, 60, 100):
        ids = torch.randint(0, tm.BPE_VOCAB_SIZE, (1, length), generator=generator)
        produced: list[int] = []
        with torch.no_grad():
            for _ in range(16):
                logits = model(ids).logits[0, -1]
                top2 = torch.topk(logits, 2).values
                gaps.append((top2[0] - top2[1]).item())
                token = int(logits.argmax())
                produced.append(token)
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        assert len(set(produced)) > 2, f"greedy output is degenerate for length {length}: {produced}"
        assert produced[0] != int(ids[0, length - 1]), "the model just copies its last input token"
    gaps.sort()
    median = gaps[len(gaps) // 2]
    assert median > 0.1, f"median top1-top2 logit gap {median:.4g} is too small"
    # The HF eager/sdpa/KV-cache paths disagree by about 1e-5 on these logits.
    assert gaps[0] > 1e-4, f"smallest top1-top2 logit gap {gaps[0]:.3g} is within float32 noise"


# ---------------------------------------------------------------------------------------
# The cache: default_model_dir and ensure_tiny_model
# ---------------------------------------------------------------------------------------


def test_default_model_dir_honours_inferlab_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path / "cache"))
    assert tm.default_model_dir() == tmp_path / "cache" / "tiny-qwen3-seed0"
    assert tm.default_model_dir().name == tm.DEFAULT_MODEL_NAME
    monkeypatch.delenv("INFERLAB_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tm.default_model_dir() == tmp_path / "home" / ".cache" / "inferlab" / "tiny-qwen3-seed0"


def test_ensure_builds_once_then_reuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, build_counter: list[int]
) -> None:
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    path = tm.ensure_tiny_model()
    assert path == tmp_path / "tiny-qwen3-seed0"
    assert build_counter == [0]
    assert tm._is_complete(path, 0)
    weights_mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert tm.ensure_tiny_model() == path
    assert tm.ensure_tiny_model(path) == path
    assert build_counter == [0], "a complete cached model was rebuilt"
    assert (path / "model.safetensors").stat().st_mtime_ns == weights_mtime
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-qwen3-seed0"], "temporary folders left behind"


def test_leftover_temp_folder_does_not_fool_ensure(
    model_dir: pathlib.Path, tmp_path: pathlib.Path, build_counter: list[int]
) -> None:
    # What a build killed mid-way (SIGKILL: no cleanup ran) leaves behind: a hidden
    # sibling with some files, even a marker.
    target = tmp_path / "tiny-qwen3-seed0"
    leftover = tmp_path / ".tiny-qwen3-seed0.tmp-deadbeef"
    leftover.mkdir()
    for name in ("config.json", "tokenizer.json", tm.MARKER_FILE):
        shutil.copy(model_dir / name, leftover / name)
    assert tm.ensure_tiny_model(target) == target
    assert build_counter == [0]
    assert (target / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert transformers.AutoModelForCausalLM.from_pretrained(target) is not None


def test_interrupted_build_leaves_no_folder_that_looks_complete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    real_builder = tm.make_tiny_model

    def dies_halfway(out_dir: str | os.PathLike[str], seed: int = 0) -> pathlib.Path:
        real_builder(out_dir, seed=seed)
        (pathlib.Path(out_dir) / "model.safetensors").write_bytes(b"truncated")
        raise KeyboardInterrupt  # e.g. Ctrl-C while the weights were being written

    target = tmp_path / "model"
    monkeypatch.setattr(tm, "make_tiny_model", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        tm.ensure_tiny_model(target)
    assert not target.exists(), "an interrupted build must not appear at the target path"
    assert list(tmp_path.iterdir()) == [], "the partial build should have been removed"

    monkeypatch.setattr(tm, "make_tiny_model", real_builder)
    assert tm.ensure_tiny_model(target) == target
    assert tm._is_complete(target, 0)


def test_damaged_or_outdated_build_is_rebuilt(
    model_dir: pathlib.Path, tmp_path: pathlib.Path, build_counter: list[int]
) -> None:
    target = tmp_path / "model"
    shutil.copytree(model_dir, target)
    assert tm.ensure_tiny_model(target) == target
    assert build_counter == [], "an intact copy should be reused"

    (target / "model.safetensors").write_bytes(b"")
    tm.ensure_tiny_model(target)
    assert build_counter == [0]
    assert (target / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()

    marker = json.loads((target / tm.MARKER_FILE).read_text())
    marker["format_version"] = tm.TINY_MODEL_FORMAT_VERSION - 1
    (target / tm.MARKER_FILE).write_text(json.dumps(marker))
    tm.ensure_tiny_model(target)
    assert build_counter == [0, 0]
    assert json.loads((target / tm.MARKER_FILE).read_text())["format_version"] == tm.TINY_MODEL_FORMAT_VERSION
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], "stale or temporary folders left behind"


def test_ensure_refuses_to_overwrite_foreign_folders(tmp_path: pathlib.Path, build_counter: list[int]) -> None:
    foreign = tmp_path / "my-model"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.raises(FileExistsError):
        tm.ensure_tiny_model(foreign)
    assert [p.name for p in foreign.iterdir()] == ["config.json"]
    assert (foreign / "config.json").read_text() == "{}"
    assert build_counter == []

    empty = tmp_path / "empty"
    empty.mkdir()
    assert tm.ensure_tiny_model(empty) == empty
    assert tm._is_complete(empty, 0)


def test_ensure_refuses_a_model_built_with_another_seed(
    model_dir: pathlib.Path, tmp_path: pathlib.Path, build_counter: list[int]
) -> None:
    target = tmp_path / "model"
    shutil.copytree(model_dir, target)
    with pytest.raises(ValueError, match="seed 0"):
        tm.ensure_tiny_model(target, seed=1)
    assert build_counter == []
    assert tm._is_complete(target, 0)


def test_ensure_default_path_follows_the_seed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, build_counter: list[int]
) -> None:
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    path = tm.ensure_tiny_model(seed=2)
    assert path == tmp_path / "tiny-qwen3-seed2"
    assert build_counter == [2]
    assert json.loads((path / tm.MARKER_FILE).read_text())["seed"] == 2

