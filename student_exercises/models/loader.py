# Generated from reference/models/loader.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Load Hugging Face safetensors weights into our (partly fused) modules."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def load_weights(model: nn.Module, folder: str) -> None:
    """Copy every checkpoint tensor into its parameter; fail loudly on gaps.

    Separate q/k/v (and gate/up) tensors are written into their slice of the
    fused parameter, in the order the model's `packed_modules` gives. A
    parameter with a `weight_loader` (the tensor-parallel layers) cuts its
    own rank's slice out of the checkpoint tensor.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    packed = getattr(model, "packed_modules", {})
    loaded: set[str] = set()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder!r}")
    for file in files:
        try:
            _load_file(file, params, packed, loaded)
        except Exception as err:   # name the file: "header too large" alone does not say which
            raise ValueError(f"{file}: cannot load weights: {type(err).__name__}: {err}") from err
    _check_complete(model, packed, loaded)


def _load_file(file: Path, params: dict, packed: dict, loaded: set[str]) -> None:
    """Copy the tensors of one safetensors file into their parameters."""
    with safe_open(str(file), framework="pt") as f:
        for name in f.keys():
            tensor = f.get_tensor(name)
            part = next((p for p in packed if f".{p}." in name), None)
            if part is None:
                if name not in params:
                    continue  # e.g. rotary buffers some exporters include
                _copy_into(params[name], tensor, None)
                loaded.add(name)
                continue
            fused_part, shard = packed[part]
            target_name = name.replace(f".{part}.", f".{fused_part}.")
            _copy_into(params[target_name], tensor, shard)
            loaded.add(f"{target_name}#{shard}")


def _copy_into(param: nn.Parameter, tensor: torch.Tensor, shard: int | None) -> None:
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        loader(param, tensor, shard)
    elif shard is None:
        param.data.copy_(tensor)
    else:
        raise ValueError(f"a fused parameter of shape {tuple(param.shape)} has no weight_loader")


def _check_complete(model: nn.Module, packed: dict, loaded: set[str]) -> None:
    """Every parameter (tied ones counted once) must have come from the checkpoint."""
    num_shards: dict[str, int] = {}
    for fused, shard in packed.values():
        num_shards[fused] = max(num_shards.get(fused, 0), shard + 1)
    missing = []
    for name, _ in model.named_parameters():
        fused = next((f for f in num_shards if f".{f}." in name), None)
        expected = [f"{name}#{s}" for s in range(num_shards[fused])] if fused else [name]
        missing += [e for e in expected if e not in loaded]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
