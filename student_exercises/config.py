# Generated from reference/config.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Engine configuration: one validated dataclass that every component reads.

Validation happens once, here, so that a wrong setting fails at `LLM(...)` with
a message naming the field instead of deep inside a kernel.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"auto": None, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BACKENDS = ("auto", "torch", "triton", "flash-attn")
SUPPORTED_ARCHITECTURE = "Qwen3ForCausalLM"   # the one model family models/qwen3.py implements


@dataclass
class Config:
    """All engine settings. `model` is a Hugging Face-format folder."""

    model: str
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None      # default: min(model's max positions, 4096)
    kvcache_block_size: int = 16
    num_kvcache_blocks: int | None = None  # explicit in tests; derived from memory otherwise
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = False
    enforce_eager: bool = False
    async_scheduling: bool = False  # schedule decode step k+1 while the GPU computes step k (see LLMEngine)
    attention_backend: str = "auto"
    lifecycle_log: str | None = None
    seed: int = 0
    cpu_threads: int | None = None  # None: 1 for tiny models on the CPU, torch's default otherwise
    tensor_parallel_size: int = 1   # ranks (processes; GPUs on CUDA) the model is split over
    hf_config: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)):
            raise TypeError(f"Config.model must be a folder path, got {type(self.model).__name__}")
        self.model = str(self.model)
        config_path = Path(self.model) / "config.json"
        if not config_path.is_file():
            raise ValueError(f"Config.model: no config.json in {self.model!r} (expected a Hugging Face model folder)")
        try:
            self.hf_config = json.loads(config_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"Config.model: cannot read {config_path}: {err}") from None
        self._check_architecture(config_path)
        self._check_variant(config_path)

        self._choice("device", DEVICES)
        self._choice("dtype", tuple(DTYPES))
        self._choice("attention_backend", BACKENDS)
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("Config.device is 'cuda' but torch sees no CUDA device")

        for name in ("max_num_seqs", "max_num_batched_tokens", "kvcache_block_size", "seed"):
            self._positive_int(name, allow_zero=(name == "seed"))
        if self.num_kvcache_blocks is not None:
            self._positive_int("num_kvcache_blocks")
        if self.cpu_threads is not None:
            self._positive_int("cpu_threads")
        model_limit = int(self.hf_config.get("max_position_embeddings", 4096))
        if self.max_model_len is None:
            self.max_model_len = min(model_limit, 4096)
        self._positive_int("max_model_len")
        if self.max_model_len > model_limit:
            raise ValueError(f"Config.max_model_len={self.max_model_len} exceeds the model's "
                             f"max_position_embeddings={model_limit}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"Config.max_num_batched_tokens={self.max_num_batched_tokens} is below "
                f"max_model_len={self.max_model_len}: a long prompt could never be scheduled. "
                "Raise it or set enable_chunked_prefill=True")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"Config.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        self._check_tensor_parallel()
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "async_scheduling"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Config.{name} must be a bool")

    def _check_tensor_parallel(self) -> None:
        """Every split dimension must divide by N: a rank cannot hold half a KV head."""
        self._positive_int("tensor_parallel_size")
        n = self.tensor_parallel_size
        if n == 1:
            return
        for key in ("num_key_value_heads", "num_attention_heads", "intermediate_size"):
            value = int(self.hf_config.get(key, 0))
            if value % n:
                raise ValueError(f"Config.tensor_parallel_size={n} does not divide the model's {key}={value}: "
                                 f"each rank must hold a whole share; pick a size that divides {value}")
        if self.device == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(f"Config.tensor_parallel_size={n} needs {n} GPUs, torch sees {torch.cuda.device_count()}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """fp32 on the CPU (exact comparisons with transformers); the model's own dtype on CUDA."""
        chosen = DTYPES[self.dtype]
        if chosen is not None:
            return chosen
        if self.device == "cpu":
            return torch.float32
        name = self.hf_config.get("torch_dtype") or self.hf_config.get("dtype") or "bfloat16"
        return DTYPES.get(str(name).replace("torch.", ""), torch.bfloat16) or torch.bfloat16

    def _check_architecture(self, config_path: Path) -> None:
        """Refuse a checkpoint of another model family instead of running it as Qwen3.

        Loading Llama weights into our Qwen3 modules could even succeed tensor by
        tensor (the names overlap) and then produce nonsense, so the check reads
        what the folder says it is. A config that names no architecture at all
        (a hand-written one for a scheduler test) is taken as it is.
        """
        if not isinstance(self.hf_config, dict):
            raise ValueError(f"Config.model: {config_path} must hold a JSON object")
        architectures = self.hf_config.get("architectures") or []
        model_type = self.hf_config.get("model_type")
        if SUPPORTED_ARCHITECTURE in architectures or (not architectures and model_type in (None, "qwen3")):
            return
        named = ", ".join(map(str, architectures)) or f"model_type {model_type!r}"
        raise ValueError(f"Config.model: {config_path} describes {named}, but this engine implements only "
                         f"{SUPPORTED_ARCHITECTURE} (Qwen3)")

    def _check_variant(self, config_path: Path) -> None:
        """Refuse a Qwen3 config asking for what models/qwen3.py does not implement: another activation,
        sliding-window attention.

        Such a checkpoint loads tensor by tensor (its weights have the same
        names and shapes) and then generates other tokens than transformers
        does, with nothing to say why. Released Qwen3 checkpoints use SiLU and
        full attention in every layer (`use_sliding_window: false`). RoPE
        scaling is refused where the model reads it (`models/qwen3.rope_theta`).
        """
        cfg = self.hf_config
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"Config.model: {config_path} sets hidden_act={act!r}, but models/qwen3.py "
                             "implements only 'silu' (SwiGLU)")
        layers = int(cfg.get("num_hidden_layers", 0))
        layer_types = cfg.get("layer_types")
        if layer_types is not None:     # newer transformers write it; it decides each layer's attention
            sliding = [i for i, kind in enumerate(layer_types) if kind != "full_attention"]
        elif cfg.get("use_sliding_window") and cfg.get("sliding_window"):   # older configs: layers from
            sliding = list(range(int(cfg.get("max_window_layers", layers)), layers))   # max_window_layers on
        else:
            sliding = []
        if sliding:
            raise ValueError(f"Config.model: {config_path} asks for sliding-window attention in layers {sliding}, "
                             "but this engine attends to the whole sequence in every layer")

    def _choice(self, name: str, allowed: tuple[str, ...]) -> None:
        value = getattr(self, name)
        if value not in allowed:
            raise ValueError(f"Config.{name} must be one of {allowed}, got {value!r}")

    def _positive_int(self, name: str, allow_zero: bool = False) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Config.{name} must be an int, got {type(value).__name__}")
        if value < (0 if allow_zero else 1):
            raise ValueError(f"Config.{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
