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
than one per block and layer. The gather and the scatter on arrival copy
the cache's bytes as 8-byte words (`as_words`), whatever its dtype.

Neither engine waits for the bytes. P offers every request its step
finished at once and collects the replies together (one wait for D's next
poll per step, not one per request), then posts each send (`isend`) and
frees the blocks: the gather that copied them is queued before anything that
could overwrite them. D posts the receive (`irecv`) as it accepts, keeps
decoding its other requests, and queues the request once the receive has
completed (`Transfer.done`, polled between steps). On two GPUs the bytes move
on NCCL's own stream while both engines compute: the transfer overlaps the
next step instead of blocking it. The price: a handed-off request joins D's
batch a poll later than a blocking receive would let it, and a transfer's
logged `seconds` run from its post to the poll that saw it complete (an upper
bound on the transfer's own time; scripts/gpu_tp.py measures the link itself).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

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


@dataclass
class Transfer:
    """One posted send or receive of a request's K/V, until it completes."""
    seq: Sequence
    work: object | None               # torch.distributed Work; None: nothing to move (all cached on D)
    payload: torch.Tensor | None
    blocks: int
    nbytes: int
    start: float = field(default_factory=time.perf_counter)
    extra: dict = field(default_factory=dict)

    def done(self) -> bool:
        """Whether it completed; a transfer through host memory (gloo) is waited for here.

        gloo marks a point-to-point Work complete only inside `wait()`, so
        polling it would never see it finish; and through host memory there
        is no GPU stream to overlap with anyway.
        """
        if self.work is None:
            return True
        if not self.payload.is_cuda:
            self.work.wait()
            return True
        return self.work.is_completed()


def as_words(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache's bytes as 8-byte words (a view), where its rows divide into them; else the cache itself.

    Why: the gather before a send and the scatter after a receive copy whole
    blocks, but an indexed copy moves one element per step of its loop, so a
    bf16 cache moved 2 bytes at a time and ran at a fraction of a plain copy
    (docs/performance.md, the sixth stop's `kvlink`). Viewed as int64 words
    the same bytes move in a quarter of the steps; the bits are untouched,
    and both ends view the cache alike, so sender and receiver agree on the
    payload's dtype and shape.
    """
    if kv_cache.shape[-1] * kv_cache.element_size() % 8 or kv_cache.stride(-1) != 1 or kv_cache.element_size() >= 8:
        return kv_cache
    return kv_cache.view(torch.int64)


def post_send(seq: Sequence, kv_cache: torch.Tensor, block_ids: list[int], peer: int,
              staging_device: torch.device) -> Transfer:
    """Gather K and V of `block_ids` (every layer) into one tensor and post its send; returns at once.

    No blocks (the decode engine had them all in its prefix cache): no
    message; the receiver knows this too and posts no receive.
    """
    if not block_ids:
        return Transfer(seq, None, None, 0, 0)
    index = torch.tensor(block_ids, dtype=torch.int64, device=kv_cache.device)
    payload = as_words(kv_cache)[:, :, index].contiguous().to(staging_device)
    work = dist.isend(payload, dst=peer)
    return Transfer(seq, work, payload, len(block_ids), payload.numel() * payload.element_size())


def post_receive(seq: Sequence, kv_cache: torch.Tensor, block_ids: list[int], peer: int,
                 staging_device: torch.device) -> Transfer:
    """Post the receive of what `post_send` sends for `block_ids`; `store` puts it in place once done."""
    if not block_ids:
        return Transfer(seq, None, None, 0, 0)
    words = as_words(kv_cache)
    shape = (words.shape[0], words.shape[1], len(block_ids), *words.shape[3:])
    payload = torch.empty(shape, dtype=words.dtype, device=staging_device)
    work = dist.irecv(payload, src=peer)
    return Transfer(seq, work, payload, len(block_ids), payload.numel() * payload.element_size())


def store(transfer: Transfer, kv_cache: torch.Tensor, block_ids: list[int]) -> None:
    """Copy a completed receive into its blocks (queued on the engine's stream, behind the receive)."""
    if transfer.work is None:
        return
    if transfer.payload.is_cuda:
        transfer.work.wait()  # NCCL: the engine's stream waits for the receive's (the host does not)
    index = torch.tensor(block_ids, dtype=torch.int64, device=kv_cache.device)
    as_words(kv_cache)[:, :, index] = transfer.payload.to(kv_cache.device, non_blocking=True)
    transfer.payload = None


def offer(engine, seqs: list[Sequence], request_of: dict[int, int], pipe, peer: int,
          staging: torch.device) -> list[Transfer]:
    """P's side: offer prefilled sequences to D; post the K/V of those it accepts and drop them here.

    Every header goes first, then every reply is read: D answers them all at
    its next poll. A deferred sequence stays on P, untouched, for a later try.
    Returns the posted sends (`drain_sent` logs each once it has completed).
    """
    for seq in seqs:
        pipe.send(Handoff.of(seq, request_of[seq.seq_id]))
    sent = []
    for seq in seqs:
        reply = pipe.recv()
        if reply[0] == "defer":
            continue
        _, first, last = reply
        sent.append(post_send(seq, engine.model_runner.kv_cache, seq.block_table[first:last], peer, staging))
        engine.hand_off(seq)     # P's blocks go back to its pool (their prefix stays cached); the gather is queued
        del request_of[seq.seq_id]
    return sent


def drain_sent(engine, sending: deque) -> None:
    """Log KV_SENT for the sends that have completed, oldest first."""
    while sending and sending[0].done():
        t = sending.popleft()
        engine.log.emit("KV_SENT", t.seq.seq_id, blocks=t.blocks, bytes=t.nbytes, seconds=time.perf_counter() - t.start)


def accept(engine, handoff: Handoff, pipe, peer: int, staging: torch.device) -> Transfer | None:
    """D's side: allocate blocks for a handed-off request and post the receive of its K/V.

    Returns the posted receive, or None if there was no room (deferred);
    `drain_received` queues the request once its K/V are in place.
    """
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
    transfer = post_receive(seq, engine.model_runner.kv_cache, seq.block_table[first:last], peer, staging)
    transfer.extra = {"computed": computed, "first": first, "last": last, "request_id": handoff.request_id}
    return transfer


def drain_received(engine, receiving: deque) -> list[Transfer]:
    """Queue, oldest first, the handed-off requests whose K/V have arrived; returns their transfers."""
    ready = []
    while receiving and receiving[0].done():
        t = receiving.popleft()
        first, last = t.extra["first"], t.extra["last"]
        store(t, engine.model_runner.kv_cache, t.seq.block_table[first:last])
        engine.adopt(t.seq, t.extra["computed"])     # decode next: its prompt was prefilled on P
        seconds = time.perf_counter() - t.start
        t.extra["seconds"] = seconds
        engine.log.emit("KV_RECEIVED", t.seq.seq_id, blocks=t.blocks, bytes=t.nbytes, seconds=seconds,
                        cached_blocks=first)
        ready.append(t)
    return ready
