"""The one-shot all-reduce (reference/kernels/all_reduce.py).

On the CPU the Triton interpreter runs rank 0's side with rank 1's part
already in place in rank 0's buffer (or not, for a peer that never comes):
the sum, the part rank 0 leaves in rank 1's buffer (-0.0 sent as +0.0,
since -0.0 marks an empty slot), the slot emptied after use, the alternating
halves, and the give-up. On 2 GPUs (marked gpu) two processes all-reduce
through CUDA IPC, eagerly and inside a CUDA graph, against the exact sum,
and with the norm fused in against the norm applied afterwards.
"""
from __future__ import annotations

import os
import tempfile

import pytest
import torch


def empty_buffers(max_bytes: int) -> list[torch.Tensor]:
    """Two ranks' buffers of fp32, every element -0.0 (empty), as OneShotAllReduce allocates them."""
    from reference.kernels.all_reduce import buffer_bytes
    return [torch.full((buffer_bytes(2, max_bytes) // 4,), -0.0) for _ in range(2)]


def is_empty(t: torch.Tensor) -> bool:
    return bool(((t == 0) & torch.signbit(t)).all())


def simulated_rank0(n: int, max_bytes: int, epochs: torch.Tensor, bufs, rank1_data: torch.Tensor, arrived: bool,
                    x: torch.Tensor, error: torch.Tensor, residual: torch.Tensor | None = None, norm=None):
    """Rank 0's call with rank 1's part already pushed into rank 0's buffer if `arrived` (else its slot is empty).

    `norm`: (weight, eps) to call the kernel that also normalizes rows (x and residual then [rows, hidden]).
    """
    from reference.kernels.all_reduce import one_shot_all_reduce, one_shot_all_reduce_norm
    epoch = int(epochs[0]) + 1
    slot = max_bytes // 4
    first_slot = (epoch % 2) * 2
    if arrived:
        bufs[0][(first_slot + 1) * slot:(first_slot + 1) * slot + n] = rank1_data    # rank 1's slot in my buffer
    addrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    if norm is not None:
        return one_shot_all_reduce_norm(x, residual, *norm, addrs, epochs, error, 0, 2, max_bytes, wait_s=0.05)
    return one_shot_all_reduce(x, addrs, epochs, error, 0, 2, max_bytes, residual=residual, wait_s=0.05)


def slots_of(bufs, max_bytes: int, call: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank 0's part as rank 1 holds it, rank 1's slot in rank 0's buffer) of call number `call`."""
    slot, first_slot = max_bytes // 4, (call % 2) * 2
    return bufs[1][first_slot * slot:][:n], bufs[0][(first_slot + 1) * slot:][:n]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs under the Triton interpreter")
def test_one_shot_all_reduce_under_the_interpreter():
    pytest.importorskip("triton")
    programs, n, max_bytes = 3, 5000, 4 * 6000
    bufs = empty_buffers(max_bytes)
    epochs = torch.zeros(programs, dtype=torch.int32)
    error = torch.zeros(1, dtype=torch.int32)
    for call in (1, 2, 3):
        mine, theirs, residual = torch.randn(n), torch.randn(n), torch.randn(n)
        mine[7], theirs[7], mine[8] = -0.0, 0.0, -0.0      # a -0.0 of mine must not read as "empty" at rank 1
        x = mine.clone()
        with_residual = call == 3
        out = simulated_rank0(n, max_bytes, epochs, bufs, theirs, True, x, error,
                              residual=residual.clone() if with_residual else None)
        expected = mine + theirs
        assert torch.equal(out, expected + residual if with_residual else expected), f"call {call}: wrong sum"
        assert epochs.tolist() == [call] * programs
        pushed, received = slots_of(bufs, max_bytes, call, n)
        assert torch.equal(pushed, mine), f"call {call}: my part is not in my slot of rank 1's buffer"
        assert not torch.signbit(pushed[7:9]).any(), f"call {call}: -0.0 was sent as is (it means 'empty')"
        assert is_empty(received), f"call {call}: rank 1's slot was not emptied after use"
        assert is_empty(bufs[0]), f"call {call}: rank 0's buffer holds something after the call"
    assert error.item() == 0
    x = torch.randn(n)
    simulated_rank0(n, max_bytes, epochs, bufs, torch.randn(n), False, x, error)   # rank 1 never comes
    assert error.item() == 1


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs under the Triton interpreter")
def test_all_reduce_with_the_norm_fused_in_under_the_interpreter():
    """The stream gets residual + the sum (exactly, in fp32), and the normed rows are rms_norm(stream) * weight.

    Rows of 40 (not a power of two: the row is masked), more rows than programs, and calls alternating
    with the plain kernel on the same call numbers (each call of either kind moves every program's number).
    """
    pytest.importorskip("triton")
    from reference.models.qwen3 import rms_norm
    programs, rows, hidden, max_bytes = 3, 7, 40, 4 * 400
    n = rows * hidden
    bufs = empty_buffers(max_bytes)
    epochs = torch.zeros(programs, dtype=torch.int32)
    error = torch.zeros(1, dtype=torch.int32)
    gen = torch.Generator().manual_seed(5)
    weight, eps = torch.rand(hidden, generator=gen) + 0.5, 1e-6
    for call in (1, 2, 3, 4):
        mine, theirs = torch.randn(rows, hidden, generator=gen), torch.randn(rows, hidden, generator=gen)
        residual = torch.randn(rows, hidden, generator=gen)
        if call == 2:      # a plain call between fused ones
            out = simulated_rank0(n, max_bytes, epochs, bufs, theirs.flatten(), True, mine.clone().flatten(), error)
            assert torch.equal(out, (mine + theirs).flatten()), f"call {call}: wrong sum"
            continue
        stream, normed = simulated_rank0(n, max_bytes, epochs, bufs, theirs.flatten(), True, mine.clone(), error,
                                         residual=residual.clone(), norm=(weight, eps))
        want = residual + (mine + theirs)
        assert torch.equal(stream, want), f"call {call}: the stream is not residual + the sum"
        torch.testing.assert_close(normed, rms_norm(want, weight, eps), rtol=1e-6, atol=1e-6,
                                   msg=f"call {call}: the normed rows are not rms_norm(stream) * weight")
        assert epochs.tolist() == [call] * programs
        pushed, received = slots_of(bufs, max_bytes, call, n)
        assert torch.equal(pushed, mine.flatten()), f"call {call}: my rows are not in my slot of rank 1's buffer"
        assert is_empty(bufs[0]), f"call {call}: rank 1's rows were not emptied after use"
    assert error.item() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_warp_of_a_program_takes_the_same_call_number():
    """Warps 1-3 of a program reach the call-number bump ~10 us after warp 0 (each first follows a chain of
    dependent loads): all must still take the same number, and the program must bump it by one.

    Before the bump read and wrote the number with no barrier between, a late warp read the number warp 0
    had already bumped and used the other parity's slots; in the engine that made both ranks wait for parts
    that had gone to the wrong set (docs/performance.md, the eighth stop).
    """
    pytest.importorskip("triton")
    import triton
    import triton.language as tl
    from reference.kernels.all_reduce import _next_call

    @triton.jit
    def late_warps(epochs_ptr, addrs_ptr, chain_ptr, out_ptr, HOPS: tl.constexpr):
        lanes = tl.arange(0, 128)                      # 4 warps, one lane per thread
        hop = tl.zeros([128], dtype=tl.int32)
        for _ in range(HOPS):                          # warps 1-3 only: warp 0's loads are masked off
            hop = tl.load(chain_ptr + hop, mask=lanes >= 32, other=0, volatile=True)
        first_slot, _ = _next_call(epochs_ptr + hop, addrs_ptr, 0, 1, tl.int16, 2)
        tl.store(out_ptr + lanes, first_slot)

    epochs = torch.zeros(1, dtype=torch.int32, device="cuda")
    addrs = torch.zeros(2, dtype=torch.int64, device="cuda")
    chain = torch.zeros(1, dtype=torch.int32, device="cuda")       # every hop leads back to element 0
    out = torch.full((128,), -1, dtype=torch.int32, device="cuda")
    for call in range(1, 6):
        late_warps[(1,)](epochs, addrs, chain, out, HOPS=32, num_warps=4)
        torch.cuda.synchronize()
        assert epochs.item() == call, f"call {call}: the call number is {epochs.item()}, not bumped by one"
        taken = sorted(set(out.tolist()))
        assert taken == [(call % 2) * 2], f"call {call}: the warps took the sets {taken}, want only {(call % 2) * 2}"


def exact_sum(x: torch.Tensor) -> torch.Tensor:
    """Both ranks' x summed in fp32 and rounded once (what the one-shot kernel must give); collective (NCCL)."""
    import torch.distributed as dist
    parts = [torch.empty_like(x) for _ in range(2)]
    dist.all_gather(parts, x)
    return (parts[0].float() + parts[1].float()).to(x.dtype)


def back_to_back(ar, generator, shared, failures: list) -> None:
    """As a decode step runs them: 72 calls in a graph, plain (with a residual) and with the norm fused in by
    turns, at 64 and 256 rows, the graph replayed 100 times with no pause; then no wait gave up, the ranks
    hold the same bits, and a fresh call still sums right."""
    import torch.distributed as dist
    for rows in (64, 256):
        x = torch.randn(rows, 4096, device="cuda", generator=generator).to(torch.bfloat16)
        stream = torch.randn(rows, 4096, device="cuda", generator=shared).to(torch.bfloat16)
        weight = torch.linspace(0.5, 1.5, 4096, device="cuda").to(torch.bfloat16)
        ar(x, residual=stream)
        ar.add_norm(x, stream, weight, 1e-6)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(36):
                ar(x, residual=stream)
                _, normed = ar.add_norm(x, stream, weight, 1e-6)
        for _ in range(100):
            graph.replay()
        torch.cuda.synchronize()
        if ar.error.item():
            failures.append(f"back to back, {rows} rows: a wait gave up")
            return
        parts = [torch.empty_like(normed) for _ in range(2)]
        dist.all_gather(parts, normed)
        if not torch.equal(parts[0], parts[1]):
            failures.append(f"back to back, {rows} rows: the ranks' normed rows differ")
        del graph
        y = torch.randn(rows, 4096, device="cuda", generator=generator).to(torch.bfloat16)
        expected = exact_sum(y)       # before the call: it sums in place
        if not torch.equal(ar(y), expected):
            failures.append(f"back to back, {rows} rows: a call after them sums wrong")


def a_late_peer_is_waited_for(ar, rank: int, generator, failures: list) -> None:
    """Rank 1 comes 10 s late (a peer compiling a kernel): rank 0 waits for it, and the sum is right."""
    import time
    y = torch.randn(64, 4096, device="cuda", generator=generator).to(torch.bfloat16)
    expected = exact_sum(y)
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(10)
    ar(y)
    torch.cuda.synchronize()
    if ar.error.item() or not torch.equal(y, expected):
        failures.append("a peer 10 s late was given up on, or the sum was wrong")


def a_missing_peer_is_given_up_on(rank: int, control, failures: list) -> None:
    """Rank 0 calls alone, with a limit of 0.5 s: the wait ends after about that long, and the error is raised."""
    import time
    import torch.distributed as dist
    from reference.distributed.custom_all_reduce import OneShotAllReduce
    from reference.kernels.all_reduce import one_shot_all_reduce
    alone = OneShotAllReduce(rank, 2, torch.bfloat16, 64 * 4096 * 2, control)
    if rank == 0:
        y = torch.ones(64, 4096, device="cuda", dtype=torch.bfloat16)
        args = (alone.addrs, alone.epochs, alone.error, 0, 2, alone.max_bytes)
        one_shot_all_reduce(y, *args, wait_s=0.5)  # compiles (and gives up)
        torch.cuda.synchronize()
        alone.error.zero_()
        start = time.monotonic()
        one_shot_all_reduce(y, *args, wait_s=0.5)
        torch.cuda.synchronize()
        took = time.monotonic() - start
        if alone.error.item() != 1 or not 0.4 < took < 5:
            failures.append(f"alone: error {alone.error.item()} after {took:.2f} s (want 1 after ~0.5 s)")
    dist.barrier(group=control)
    alone.close()


def _rank(rank: int, init_file: str, result_file: str) -> None:
    import torch.distributed as dist
    from reference.distributed.custom_all_reduce import OneShotAllReduce
    from reference.models.qwen3 import rms_norm
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    control = dist.new_group(backend="gloo")
    ar = OneShotAllReduce(rank, 2, torch.bfloat16, 256 * 4096 * 2, control)
    failures = []

    def check(x: torch.Tensor, label: str) -> None:
        parts = [torch.empty_like(x) for _ in range(2)]
        dist.all_gather(parts, x)
        if not torch.equal(parts[0], parts[1]):
            failures.append(f"{label}: ranks differ")

    generator = torch.Generator(device="cuda").manual_seed(100 + rank)
    shared = torch.Generator(device="cuda").manual_seed(7)     # draws the same numbers on both ranks
    for rows in (1, 3, 64, 256):
        for width in (4096, 1000):
            if rows * width * 2 > ar.max_bytes:
                continue
            x = torch.randn(rows, width, device="cuda", generator=generator).to(torch.bfloat16)
            expected = exact_sum(x)
            residual = torch.randn(rows, width, device="cuda", generator=generator).to(torch.bfloat16)
            with_residual = residual + expected        # what residual + all_reduce(x) gives
            y = x.clone()
            ar(x)
            if not torch.equal(x, expected):
                failures.append(f"eager {rows}x{width}: wrong sum")
            check(x, f"eager {rows}x{width}")
            z = y.clone()
            ar(y, residual=residual)
            if not torch.equal(residual, with_residual):
                failures.append(f"eager {rows}x{width} with a residual: wrong sum")
            # The norm fused in; the stream and the weight the same on both ranks, as a model's are.
            stream_in = torch.randn(rows, width, device="cuda", generator=shared).to(torch.bfloat16)
            weight = torch.linspace(0.5, 1.5, width, device="cuda").to(torch.bfloat16)
            want_stream = stream_in + expected
            stream, normed = ar.add_norm(z, stream_in, weight, 1e-6)
            if not torch.equal(stream, want_stream):
                failures.append(f"eager {rows}x{width}, norm fused in: the stream is not residual + the sum")
            try:
                torch.testing.assert_close(normed, rms_norm(want_stream, weight, 1e-6))
            except AssertionError as err:
                failures.append(f"eager {rows}x{width}, norm fused in: {err}")
            check(normed, f"eager {rows}x{width}, norm fused in")
    static = torch.zeros(64, 4096, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    ar(static)   # warm-up (compiles) before capture
    with torch.cuda.graph(graph):
        for _ in range(3):
            ar(static)
    for replay in range(4):
        x = torch.randn(64, 4096, device="cuda", generator=generator).to(torch.bfloat16)
        expected = exact_sum(x)
        expected = (expected.float() * 2).to(torch.bfloat16)      # each later call sums two equal halves
        expected = (expected.float() * 2).to(torch.bfloat16)
        static.copy_(x)
        graph.replay()
        if not torch.equal(static, expected):
            failures.append(f"graph replay {replay}: wrong sum")
        check(static, f"graph replay {replay}")
    torch.cuda.synchronize()
    if ar.error.item():
        failures.append("a wait gave up")
    del graph
    back_to_back(ar, generator, shared, failures)
    a_late_peer_is_waited_for(ar, rank, generator, failures)
    ar.close()
    a_missing_peer_is_given_up_on(rank, control, failures)
    dist.destroy_process_group()
    if rank == 0:
        with open(result_file, "w") as f:
            f.write("\n".join(failures) or "ok")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_one_shot_all_reduce_on_two_gpus_eager_and_in_a_graph():
    import torch.multiprocessing as mp
    from reference.distributed.custom_all_reduce import usable
    if not usable(2, torch.bfloat16):
        pytest.skip("no peer access between GPU 0 and GPU 1")
    tmp = tempfile.mkdtemp()
    result = os.path.join(tmp, "result")
    mp.start_processes(_rank, args=(os.path.join(tmp, "init"), result), nprocs=2, start_method="spawn")
    assert open(result).read() == "ok"
