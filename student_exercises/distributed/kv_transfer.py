# Generated from reference/distributed/kv_transfer.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Moving one request's KV blocks from a prefill engine to a decode engine.

The protocol, per request (P = prefill engine, rank 0; D = decode engine, rank 1):

    P -> D  header (pipe)     tokens, sampling params, times, how many tokens have K/V on P
    D       allocates blocks for the request with its own BlockManager; prefix-cache
            hits (a system prompt handed over before) need no transfer
    D -> P  reply (pipe)      ("accept", first, last): send logical blocks [first, last)
                              ("defer",): no room now; P keeps the request and asks again later
    P -> D  K/V (dist.send)   one tensor [2, layers, last - first, block_size, kv_heads, head_dim]
    D       copies it into its blocks, marks the tokens computed, queues the request as running

Control messages go over a multiprocessing pipe because D must poll for them
between its decode steps; torch.distributed has no non-blocking receive of an
object. The K/V go over torch.distributed (NCCL between GPUs, gloo otherwise),
gathered into one contiguous tensor first: one large message costs far less
than one per block and layer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from student_exercises.engine.sequence import Sequence
from student_exercises.sampling_params import SamplingParams


@dataclass
class Handoff:
    """The header P sends before the K/V: everything D needs to continue the request."""
    request_id: int
    seq_id: int                    # the prefill engine's; the decode engine keeps it, so the two logs join on it
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    generator_state: torch.Tensor | None
    num_computed_tokens: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None

    @classmethod
    def of(cls, seq: Sequence, request_id: int) -> "Handoff":
        state = seq.generator.get_state() if seq.generator is not None else None
        return cls(request_id, seq.seq_id, list(seq.token_ids), seq.num_prompt_tokens, seq.sampling_params, state,
                   seq.num_cached_tokens, seq.arrival_time, seq.first_scheduled_time, seq.first_token_time)


def send_blocks(kv_cache: torch.Tensor, block_ids: list[int], peer: int, staging_device: torch.device) -> int:
    """Send K and V of `block_ids` (every layer) as one tensor; returns the bytes sent.

    No blocks (the decode engine had them all in its prefix cache): no message;
    the receiver knows this too and does not wait for one.
    """
    if not block_ids:
        return 0
    index = torch.tensor(block_ids, dtype=torch.int64, device=kv_cache.device)
    payload = kv_cache[:, :, index].contiguous().to(staging_device)
    dist.send(payload, dst=peer)
    _wait_for_device(payload)
    return payload.numel() * payload.element_size()


def _wait_for_device(payload: torch.Tensor) -> None:
    """NCCL returns once the transfer is queued; wait for it, so the time logged is the transfer's.

    The price: the handoff blocks its engine until the bytes have moved, where
    a production system would overlap the transfer with the next step.
    """
    if payload.is_cuda:
        torch.cuda.synchronize(payload.device)


def receive_blocks(kv_cache: torch.Tensor, block_ids: list[int], peer: int, staging_device: torch.device) -> int:
    """Receive what `send_blocks` sent into `block_ids` of this cache; returns the bytes received."""
    if not block_ids:
        return 0
    shape = (kv_cache.shape[0], kv_cache.shape[1], len(block_ids), *kv_cache.shape[3:])
    payload = torch.empty(shape, dtype=kv_cache.dtype, device=staging_device)
    dist.recv(payload, src=peer)
    kv_cache[:, :, torch.tensor(block_ids, dtype=torch.int64, device=kv_cache.device)] = payload.to(kv_cache.device)
    _wait_for_device(payload)
    return payload.numel() * payload.element_size()


def offer(engine, seq: Sequence, request_id: int, pipe, peer: int, staging: torch.device) -> bool:
    """P's side: offer a prefilled sequence to D; on acceptance send its K/V and drop it here.

    Returns False if D deferred (the sequence stays on P, untouched, for a later try).
    """
    pipe.send(Handoff.of(seq, request_id))
    reply = pipe.recv()
    if reply[0] == "defer":
        return False
    _, first, last = reply
    start = time.perf_counter()
    nbytes = send_blocks(engine.model_runner.kv_cache, seq.block_table[first:last], peer, staging)
    seconds = time.perf_counter() - start
    engine.log.emit("KV_SENT", seq.seq_id, blocks=last - first, bytes=nbytes, seconds=seconds)
    engine.hand_off(seq)     # P's blocks go back to its pool (their prefix stays cached)
    return True


def accept(engine, handoff: Handoff, pipe, peer: int, staging: torch.device) -> Sequence | None:
    """D's side: allocate blocks for a handed-off request, receive its K/V, and queue it for decode."""
    block_size = engine.config.kvcache_block_size
    seq = Sequence(handoff.token_ids[:handoff.num_prompt_tokens], handoff.sampling_params, block_size,
                   arrival_time=handoff.arrival_time, seq_id=handoff.seq_id)
    for token in handoff.token_ids[handoff.num_prompt_tokens:]:
        seq.append_token(token)
    if handoff.generator_state is not None:
        # On the engine's device, as LLMEngine.enqueue makes it (a CUDA generator's state fits no CPU one).
        seq.generator = torch.Generator(device=engine.config.device).set_state(handoff.generator_state)
    seq.first_scheduled_time, seq.first_token_time = handoff.first_scheduled_time, handoff.first_token_time
    if not engine.scheduler.reserve(seq):           # prefix-cache hits set num_cached_tokens
        pipe.send(("defer",))
        return None
    computed = handoff.num_computed_tokens
    first = seq.num_cached_tokens // block_size
    last = max(first, -(-computed // block_size))
    pipe.send(("accept", first, last))
    start = time.perf_counter()
    nbytes = receive_blocks(engine.model_runner.kv_cache, seq.block_table[first:last], peer, staging)
    seconds = time.perf_counter() - start
    engine.adopt(seq, computed)                      # decode next: its prompt was prefilled on P
    engine.log.emit("KV_RECEIVED", seq.seq_id, blocks=last - first, bytes=nbytes,
                    seconds=seconds, cached_blocks=first)
    return seq
