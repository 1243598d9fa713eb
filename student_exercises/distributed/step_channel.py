# Generated from reference/distributed/step_channel.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Rank 0 -> workers: each step's batch as flat integer arrays in shared memory.

Every step, rank 0 tells the workers what to run before it runs its own
share. Until issue 35 that was `broadcast_object_list` over a gloo group: a
pickle of one object per sequence, sent over a socket, unpickled. Here rank 0
writes the batch as a few int64 arrays (ids, lengths, the step's token ids,
the new entries of the block tables: one array each, every sequence's entries
back to back; `SentTables` says why only the new entries) into
a ring of slots in one shared-memory segment, and posts a semaphore per
worker; each worker copies the arrays out, frees the slot, and rebuilds a
light `StepSequence` per sequence. Rank 0 builds no object per sequence,
pickles nothing but a short header, and makes no system call but the posts.

Why a ring of slots: under async scheduling rank 0 sends step k+1 while a
worker may still be reading step k. Each worker owns two semaphores: `full`
(messages it has not read) and `free` (slots it has read); rank 0 takes a
`free` of every worker before writing a slot, so it waits only when a worker
is a whole ring behind. Semaphores, not a spin on a counter: they carry the
memory barriers a flag in shared memory would need on a weakly ordered CPU
(Arm), and a worker that waits sleeps instead of burning a core.

The price: a slot is sized for the largest step the config allows (every
sequence at `max_model_len`), so the segment is a few MiB for large configs.
"""
from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from student_exercises.sampling_params import SamplingParams

SLOTS = 4
HEADER_BYTES = 4096          # the pickled header of one message: method name, flags, array lengths
_LENGTH = struct.Struct("<q")


# What a worker's sequences carry in a step whose sampling rows all take the argmax (`argmax_only` on rank 0):
# the worker then takes it itself, slice by slice, as rank 0 does.
GREEDY = SamplingParams(temperature=0.0)


@dataclass
class StepSequence:
    """What a worker needs of a scheduled Sequence to build the same inputs as rank 0.

    A decode step carries one token id, not the whole history; a prefill
    carries the tokens of its chunk (the cached prefix before it reads as
    zeros, which no code on a worker looks at). `sampling_params` is GREEDY
    in a step whose sampling rows all take the argmax, else None: workers
    never sample.
    """
    seq_id: int
    token_ids: list[int]
    length: int
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_table: list[int]
    sampling_params: SamplingParams | None = None
    generator: None = None

    def __len__(self) -> int:
        return self.length

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]


ARRAYS = ("seq_ids", "lengths", "num_cached", "num_scheduled", "token_counts", "tokens", "table_starts",
          "table_lens", "tables")


class _HeldTables:
    """Which sequences' block tables a worker holds after each step: one rule, kept alike on both sides.

    Rank 0 sends a table whole in a prefill step and, in a decode step, only
    the entries it gained since the worker last held it (a block every
    `block_size` tokens): at a decode batch of 256 sequences with 33-block
    tables, flattening every table each step cost rank 0 more than the rest
    of the message. What the worker holds after a step: a prefill step adds
    (or replaces) its sequences; a decode step keeps exactly its own. A
    sequence missing from a decode step finished or was preempted, and comes
    back only through a prefill, which sends its table whole again. That
    relies on what BlockManager guarantees: a table only grows at its end
    while its sequence decodes (`append`); it is replaced only by `allocate`,
    at a prefill. The worker checks the length it holds against where rank
    0's entries start, so a table that changed otherwise fails loudly.
    """

    def __init__(self):
        self.held: dict[int, list[int]] = {}

    def after_step(self, ids: list[int], is_prefill: bool) -> None:
        """The rule, applied by both sides after each step: a decode step keeps only its own sequences."""
        if not is_prefill:
            kept = set(ids)
            self.held = {i: t for i, t in self.held.items() if i in kept}


class SentTables(_HeldTables):
    """Rank 0's side: which entries of each table the workers already hold (`held` maps to table lengths)."""

    def encode(self, seqs: list, is_prefill: bool) -> tuple[list[int], list[int], list[int]]:
        """(first entry sent per sequence, entries sent per sequence, the entries back to back)."""
        starts, counts, entries = [], [], []
        for seq in seqs:
            table = seq.block_table
            start = 0 if is_prefill else self.held.get(seq.seq_id, 0)
            if start > len(table):
                start = 0
            starts.append(start)
            counts.append(len(table) - start)
            entries += table[start:]
            self.held[seq.seq_id] = len(table)
        self.after_step([seq.seq_id for seq in seqs], is_prefill)
        return starts, counts, entries


class HeldTables(_HeldTables):
    """A worker's side: the tables themselves, grown by what each step carries."""

    def update(self, seq_id: int, start: int, entries: list[int]) -> list[int]:
        table = self.held.get(seq_id, []) if start else []
        if len(table) != start:
            raise RuntimeError(f"the block table of sequence {seq_id} is out of step with rank 0's: this worker "
                               f"holds {len(table)} entries, rank 0 sent entries from {start} on")
        if entries:
            table = table + entries     # a new list: the previous step's StepSequence keeps its own
            self.held[seq_id] = table
        return table


def encode(seqs: list, is_prefill: bool, sent: SentTables) -> dict[str, np.ndarray]:
    """A batch as flat int64 arrays: one value per sequence, or every sequence's entries back to back.
    Block tables: only what the workers do not hold yet (`sent` records it)."""
    if is_prefill:
        chunks = [seq.token_ids[seq.num_cached_tokens:seq.num_cached_tokens + seq.num_scheduled_tokens] for seq in seqs]
        token_counts = [len(c) for c in chunks]
        tokens = [t for c in chunks for t in c]
    else:
        token_counts = [1] * len(seqs)
        tokens = [seq.token_ids[-1] for seq in seqs]
    starts, counts, entries = sent.encode(seqs, is_prefill)
    as_array = lambda values: np.asarray(values, dtype=np.int64)
    return {"seq_ids": as_array([seq.seq_id for seq in seqs]), "lengths": as_array([len(seq) for seq in seqs]),
            "num_cached": as_array([seq.num_cached_tokens for seq in seqs]),
            "num_scheduled": as_array([seq.num_scheduled_tokens for seq in seqs]),
            "token_counts": as_array(token_counts), "tokens": as_array(tokens),
            "table_starts": as_array(starts), "table_lens": as_array(counts), "tables": as_array(entries)}


def decode(arrays: dict[str, np.ndarray], is_prefill: bool, held: HeldTables, greedy: bool = False) -> list[StepSequence]:
    """The StepSequences `encode` described (a prefill chunk's cached prefix as zeros); GREEDY ones if `greedy`.
    Their block tables are `held`'s, grown by the entries the message carries."""
    params = GREEDY if greedy else None
    columns = {name: arrays[name].tolist() for name in ARRAYS}
    seqs, token_at, table_at = [], 0, 0
    for i, seq_id in enumerate(columns["seq_ids"]):
        n_tokens, n_blocks, cached = columns["token_counts"][i], columns["table_lens"][i], columns["num_cached"][i]
        chunk = columns["tokens"][token_at:token_at + n_tokens]
        table = held.update(seq_id, columns["table_starts"][i], columns["tables"][table_at:table_at + n_blocks])
        seqs.append(StepSequence(seq_id, [0] * cached + chunk if is_prefill else chunk, columns["lengths"][i], cached,
                                 columns["num_scheduled"][i], table, params))
        token_at += n_tokens
        table_at += n_blocks
    held.after_step(columns["seq_ids"], is_prefill)
    return seqs


def slot_bytes(max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, block_size: int) -> int:
    """The largest message a config allows: every sequence's whole block table, a full prefill's tokens."""
    blocks_per_seq = -(-max_model_len // block_size)
    values = 7 * max_num_seqs + max_num_batched_tokens + max_num_seqs + max_num_seqs * blocks_per_seq
    return HEADER_BYTES + 8 * values


class StepChannel:
    """One writer (rank 0), `workers` readers, `SLOTS` messages in flight at most.

    Built by rank 0; pickled into each worker's process arguments (spawn),
    where `attach` opens the same segment by name.
    """

    def __init__(self, ctx, workers: int, slot_size: int):
        self.slot_size = slot_size
        self.shm = shared_memory.SharedMemory(create=True, size=SLOTS * slot_size)
        self.name = self.shm.name
        self.full = [ctx.Semaphore(0) for _ in range(workers)]
        self.free = [ctx.Semaphore(SLOTS) for _ in range(workers)]
        self.owner = True
        self.next_slot = 0

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["shm"], state["owner"] = None, False
        return state

    def attach(self, worker: int) -> None:
        """In worker `worker` (0-based among the workers): open the segment; read from slot 0."""
        self.shm = shared_memory.SharedMemory(name=self.name)
        self.full, self.free = self.full[worker], self.free[worker]
        self.next_slot = 0

    # -- rank 0 -------------------------------------------------------------------
    def send(self, method: str, flags: tuple = (), arrays: dict[str, np.ndarray] | None = None,
             timeout: float | None = None) -> bool:
        """Write one message and wake every worker; False if a worker did not free a slot within `timeout`."""
        arrays = arrays or {}
        header = pickle.dumps((method, flags, [(name, len(a)) for name, a in arrays.items()]))
        size = sum(8 * len(a) for a in arrays.values())
        if len(header) + _LENGTH.size > HEADER_BYTES or HEADER_BYTES + size > self.slot_size:
            raise ValueError(f"a step message of {HEADER_BYTES + size} bytes does not fit a slot of {self.slot_size}")
        taken = []
        for free in self.free:
            if not free.acquire(timeout=timeout):
                for sem in taken:      # leave the ring as it was
                    sem.release()
                return False
            taken.append(free)
        base = self.next_slot * self.slot_size
        buf = self.shm.buf
        _LENGTH.pack_into(buf, base, len(header))
        buf[base + _LENGTH.size:base + _LENGTH.size + len(header)] = header
        offset = base + HEADER_BYTES
        for a in arrays.values():
            np.frombuffer(buf, dtype=np.int64, count=len(a), offset=offset)[:] = a
            offset += 8 * len(a)
        self.next_slot = (self.next_slot + 1) % SLOTS
        for full in self.full:
            full.release()
        return True

    # -- a worker -------------------------------------------------------------------
    def receive(self) -> tuple[str, tuple, dict[str, np.ndarray]]:
        """Wait for the next message; (method, flags, arrays), the arrays copied out of the ring."""
        self.full.acquire()
        base = self.next_slot * self.slot_size
        buf = self.shm.buf
        (length,) = _LENGTH.unpack_from(buf, base)
        method, flags, shapes = pickle.loads(bytes(buf[base + _LENGTH.size:base + _LENGTH.size + length]))
        arrays, offset = {}, base + HEADER_BYTES
        for name, n in shapes:
            arrays[name] = np.frombuffer(buf, dtype=np.int64, count=n, offset=offset).copy()
            offset += 8 * n
        self.next_slot = (self.next_slot + 1) % SLOTS
        self.free.release()
        return method, flags, arrays

    def close(self) -> None:
        """Unmap the segment; rank 0 also removes it (workers only unmap)."""
        if self.shm is None:
            return
        try:
            self.shm.close()
            if self.owner:
                self.shm.unlink()
        except (FileNotFoundError, BufferError):
            pass
        self.shm = None
