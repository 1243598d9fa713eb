# Generated from reference/parallel_state.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""This process's place in its tensor-parallel group, and the two collectives TP layers use.

The state is process-global, like torch.distributed's own default group: a
process is rank r of at most one TP group at a time. Layers read it when they
are built (to size their shards) and when they run (to all-reduce). With no
group (the default) the world size is 1 and both collectives do nothing, so
the single-device engine pays nothing for TP existing.
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Long enough for every rank to load an 8B shard and capture its CUDA graphs before
# the first collective; short enough that a dead peer does not hang CI for 30 minutes.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=300)
CPU_COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)
# How long leaving the group may take before we stop waiting for it (see destroy_tensor_parallel).
DESTROY_TIMEOUT_S = 20.0

logger = logging.getLogger(__name__)


@dataclass
class TPState:
    rank: int = 0
    world_size: int = 1
    control_group: object | None = None   # gloo group for Python objects (set-up exchanges)
    fast_all_reduce: object | None = None  # small-message all-reduce (fits(x), __call__(x), close()), or None: NCCL


_STATE = TPState()


def tp_rank() -> int:
    return _STATE.rank


def tp_world_size() -> int:
    return _STATE.world_size


def control_group():
    return _STATE.control_group


def init_tensor_parallel(rank: int, world_size: int, device: str, init_file: str) -> None:
    """Join the group: NCCL for tensors on CUDA (gloo on the CPU), plus a gloo group for objects.

    Objects (each step's scheduled sequences) go over gloo even on CUDA:
    pickled bytes would otherwise make a round trip through GPU memory.
    """
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    kwargs = {"device_id": torch.device("cuda", rank)} if device == "cuda" else {}
    timeout = COLLECTIVE_TIMEOUT if device == "cuda" else CPU_COLLECTIVE_TIMEOUT
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timeout, **kwargs)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else dist.group.WORLD
    _STATE.rank, _STATE.world_size, _STATE.control_group = rank, world_size, control


def set_fast_all_reduce(impl) -> None:
    """Route the all-reduces that `impl.fits` to `impl` (reference/distributed/custom_all_reduce.py)."""
    _STATE.fast_all_reduce = impl


def destroy_tensor_parallel(abort: bool = False, timeout_s: float = DESTROY_TIMEOUT_S) -> bool:
    """Leave the group; True if it was left within `timeout_s`.

    Whatever still uses the communicator must be gone first: NCCL's
    communicator destruction waits until every CUDA graph that captured one
    of its collectives is destroyed, so a runner that still holds its decode
    graphs would wait forever (the exit hang of issue 35). The runners drop
    their graphs before calling this.

    `abort`: a peer is gone or was stopped inside a collective, so work still
    queued on the communicator can never finish; NCCL's abort does not wait
    for it (gloo has no abort and needs none: its calls return or time out).
    Either runs on a helper thread, and a call that does not return within
    `timeout_s` is left there with a warning: a stuck teardown must not make
    the caller's exit (or a test) hang with it.
    """
    fast, _STATE.fast_all_reduce = _STATE.fast_all_reduce, None
    if fast is not None and not abort:    # freeing waits for the device, which a dead peer may keep busy
        try:
            fast.close()
        except Exception as err:   # a driver error here must not keep the group alive
            logger.warning("closing the fast all-reduce failed: %s", err)
    done = True
    if dist.is_initialized():
        done = _bounded(_abort_or_destroy, (abort,), timeout_s)
        if not done:
            logger.warning("leaving the tensor-parallel process group took over %.0f s; not waiting for it", timeout_s)
    _STATE.rank, _STATE.world_size, _STATE.control_group = 0, 1, None
    return done


def _abort_or_destroy(abort: bool) -> None:
    from torch.distributed import distributed_c10d as c10d
    if abort and dist.get_backend() == "nccl" and hasattr(c10d, "_abort_process_group"):
        c10d._abort_process_group()
    else:
        dist.destroy_process_group()


def _bounded(fn, args: tuple, timeout_s: float) -> bool:
    """fn(*args) on a daemon thread; True if it returned (or raised) within timeout_s."""
    errors: list[BaseException] = []

    def run():
        try:
            fn(*args)
        except BaseException as err:   # reported below, on the caller's thread
            errors.append(err)
    thread = threading.Thread(target=run, name="inferlab-tp-teardown", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if errors:
        logger.warning("leaving the tensor-parallel process group raised: %s", errors[0])
    return not thread.is_alive()


@contextlib.contextmanager
def layout_for(world_size: int):
    """Build a model for `world_size` ranks: this process's group, or (at 1) unsplit.

    A single-device engine may be built in a process that is also rank 0 of a
    TP engine (a test comparing the two); its layers must not see the group.
    Layers record rank and world size when built, so the override only needs
    to last through construction.
    """
    if world_size == _STATE.world_size:
        yield
        return
    if world_size != 1:
        raise RuntimeError(f"a model for {world_size} ranks needs a process group of that size "
                           f"(this process has {_STATE.world_size})")
    saved = (_STATE.rank, _STATE.world_size)
    _STATE.rank, _STATE.world_size = 0, 1
    try:
        yield
    finally:
        _STATE.rank, _STATE.world_size = saved


def all_reduce(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """Sum of x over the ranks, in place (row-parallel layers' partial sums).

    Small messages (a decode step's) go to the one-shot all-reduce where one
    is set up; the rest to torch.distributed (NCCL on CUDA, gloo on the CPU).
    """
    if world_size > 1:
        fast = _STATE.fast_all_reduce
        if fast is not None and fast.fits(x):
            return fast(x)
        dist.all_reduce(x)
    return x


def all_reduce_add(x: torch.Tensor, residual: torch.Tensor, world_size: int) -> torch.Tensor:
    """residual + (sum of x over the ranks): the end of a transformer block under tensor parallelism.

    With the one-shot all-reduce the add happens in the same kernel, which
    writes the result into `residual` (the stream is consumed, as the GEMM
    epilogue consumes it on one GPU) and saves an add kernel per block;
    otherwise it is the plain `residual + all_reduce(x)`, the same bits.
    """
    fast = _STATE.fast_all_reduce
    if world_size > 1 and fast is not None and fast.fits(x, residual):
        return fast(x, residual=residual)
    return residual + all_reduce(x, world_size)


def all_reduce_add_norm(x: torch.Tensor, residual: torch.Tensor, norm, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(stream, norm(stream)) for stream = residual + (sum of x over the ranks): a block's end and the next norm.

    `norm` is an RMSNorm (`weight`, `eps`, callable). With the one-shot
    all-reduce one kernel sums, adds and normalizes (reference/kernels/all_reduce.py
    says what that saves and what it costs in bf16); otherwise the two steps,
    `all_reduce_add` then `norm`.
    """
    fast = _STATE.fast_all_reduce
    if (world_size > 1 and fast is not None and fast.fits(x, residual) and x.dim() == 2
            and x.shape[1] == norm.weight.shape[0] and norm.weight.dtype == x.dtype and norm.weight.is_contiguous()):
        return fast.add_norm(x, residual, norm.weight, norm.eps)
    stream = all_reduce_add(x, residual, world_size)
    return stream, norm(stream)


def all_gather_last_dim(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """Concatenate every rank's x along the last dimension (vocab-parallel logits)."""
    if world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def agree_on_min(value: int, device: torch.device, world_size: int) -> int:
    """The smallest of every rank's value: the KV pool must have the same size everywhere."""
    if world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
