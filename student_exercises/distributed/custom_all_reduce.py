# Generated from reference/distributed/custom_all_reduce.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The buffers behind the one-shot all-reduce (reference/kernels/all_reduce.py): CUDA IPC between the ranks.

Each rank allocates one buffer with the CUDA driver (a slot per rank,
twice, every element set to the kernel's "empty" value), and exports it as
an IPC handle; the ranks swap handles over the gloo group, and each opens
the others' (`cuIpcOpenMemHandle`, with peer access): a kernel on GPU r
can then read and write GPU p's buffer by address. The driver is called
through ctypes, so nothing here needs compiling.

Why the driver's own allocation, not a torch tensor: an IPC handle names a
whole allocation, and torch's caching allocator hands out pieces of larger
ones; a buffer of our own has a known base and lives until `close`.

Used only where it can work and pays: CUDA, 2 to 8 ranks, every pair of GPUs
with peer access, the model's dtype, and messages up to the buffer's size
(decode steps); anything else goes to NCCL (`parallel_state.all_reduce`).
`INFERLAB_TP_ALL_REDUCE=nccl` turns it off, so the two can be measured
against each other (scripts/gpu_tp.py).

NVLink multicast (NVLS) is a different mechanism, which this does not use:
it maps no multicast object and leaves NCCL_NVLS_ENABLE as it finds it.
"""
from __future__ import annotations

import ctypes
import os

import torch
import torch.distributed as dist

MAX_PROGRAMS = 128
IPC_LAZY_ENABLE_PEER_ACCESS = 1


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]   # bytes, NULs included (a c_char array would stop at one)


class _Driver:
    """The few CUDA driver calls needed, on the calling thread's current context (torch's primary one)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        ptr, size = ctypes.c_uint64, ctypes.c_size_t
        signatures = {"cuMemAlloc_v2": [ctypes.POINTER(ptr), size], "cuMemsetD16_v2": [ptr, ctypes.c_ushort, size],
                      "cuMemsetD32_v2": [ptr, ctypes.c_uint, size],
                      "cuMemFree_v2": [ptr], "cuIpcGetMemHandle": [ctypes.POINTER(_IpcHandle), ptr],
                      "cuIpcOpenMemHandle_v2": [ctypes.POINTER(ptr), _IpcHandle, ctypes.c_uint],
                      "cuIpcCloseMemHandle": [ptr]}
        for name, argtypes in signatures.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def _call(self, name: str, *args) -> None:
        fn = getattr(self.lib, name)
        result = fn(*args)
        if result != 0:
            raise RuntimeError(f"CUDA driver call {name} failed with error {result}")

    def alloc(self, size: int, element_size: int, fill: int) -> int:
        """`size` bytes, every element of `element_size` bytes (2 or 4) set to the bits `fill`."""
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), size)
        bits = fill & ((1 << (8 * element_size)) - 1)
        self._call("cuMemsetD16_v2" if element_size == 2 else "cuMemsetD32_v2", ptr.value, bits, size // element_size)
        return ptr.value

    def free(self, ptr: int) -> None:
        self._call("cuMemFree_v2", ptr)

    def export(self, ptr: int) -> bytes:
        handle = _IpcHandle()
        self._call("cuIpcGetMemHandle", ctypes.byref(handle), ptr)
        return bytes(handle)

    def open(self, handle: bytes) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), _IpcHandle.from_buffer_copy(handle), IPC_LAZY_ENABLE_PEER_ACCESS)
        return ptr.value

    def close(self, ptr: int) -> None:
        self._call("cuIpcCloseMemHandle", ptr)


def wanted() -> bool:
    """Off with INFERLAB_TP_ALL_REDUCE=nccl (a measurement switch); on otherwise."""
    return os.environ.get("INFERLAB_TP_ALL_REDUCE", "custom") != "nccl"


def usable(world: int, dtype: torch.dtype) -> bool:
    """CUDA, Triton, 2..8 ranks, elements of 2 or 4 bytes, and peer access between this GPU and every other."""
    if not (torch.cuda.is_available() and 2 <= world <= 8 and dtype.itemsize in (2, 4)):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    me = torch.cuda.current_device()
    return all(torch.cuda.can_device_access_peer(me, p) for p in range(world) if p != me)


class OneShotAllReduce:
    """This rank's side of the one-shot all-reduce; collective to build (every rank at once)."""

    def __init__(self, rank: int, world: int, dtype: torch.dtype, max_bytes: int, group,
                 programs: int | None = None):
        """`programs`: the grid of every call; by default one program per SM, at most MAX_PROGRAMS. A probe may
        ask for more, as long as all of them fit on the GPU at once (a program that waits holds its SM)."""
        from student_exercises.kernels.all_reduce import (buffer_bytes, empty_value, one_shot_all_reduce,
                                                  one_shot_all_reduce_norm)
        self._kernel, self._norm_kernel = one_shot_all_reduce, one_shot_all_reduce_norm
        self.rank, self.world, self.dtype = rank, world, dtype
        self.max_bytes = -(-max_bytes // 256) * 256
        self.driver = _Driver()
        torch.cuda.synchronize()
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        programs = programs or min(MAX_PROGRAMS, sms)
        size = dtype.itemsize
        self.own = self.driver.alloc(buffer_bytes(world, self.max_bytes), size, empty_value(size))
        torch.cuda.synchronize()    # the memset done before a peer can write: it would erase what came
        mine = (self.driver.export(self.own), programs)
        everyone: list = [None] * world
        dist.all_gather_object(everyone, mine, group=group)
        self.opened = [self.driver.open(h) for r, (h, _) in enumerate(everyone) if r != rank]
        peers = iter(self.opened)
        addrs = [self.own if r == rank else next(peers) for r in range(world)]
        programs = min(grid for _, grid in everyone)    # the same grid on every rank
        device = torch.device("cuda", torch.cuda.current_device())
        self.addrs = torch.tensor(addrs, dtype=torch.int64, device=device)
        self.epochs = torch.zeros(programs, dtype=torch.int32, device=device)
        self.error = torch.zeros(1, dtype=torch.int32, device=device)

    def fits(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
        ok = x.dtype == self.dtype and x.is_cuda and x.is_contiguous() and x.numel() * x.element_size() <= self.max_bytes
        return ok and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                            and residual.is_contiguous()))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Sum of x over the ranks, in place; with `residual`, residual + that sum, written into residual."""
        return self._kernel(x, self.addrs, self.epochs, self.error, self.rank, self.world, self.max_bytes,
                            residual=residual)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + sum of x over the ranks, written into residual; its RMSNorm times weight).

        The caller checks `fits(x, residual)` and that x has rows of weight's length.
        """
        return self._norm_kernel(x, residual, weight, eps, self.addrs, self.epochs, self.error, self.rank,
                                 self.world, self.max_bytes)

    def close(self) -> None:
        """Unmap the peers' buffers and free ours (the device must be idle: no kernel may still read them)."""
        for ptr in self.opened:
            self.driver.close(ptr)
        self.opened = []
        if self.own:
            self.driver.free(self.own)
            self.own = 0


def set_up(rank: int, world: int, dtype: torch.dtype, max_bytes: int, group) -> OneShotAllReduce | None:
    """Build the one-shot all-reduce if every rank can use it, else None (all ranks agree: this is collective)."""
    mine = wanted() and usable(world, dtype)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    if not all(everyone):
        return None
    return OneShotAllReduce(rank, world, dtype, max_bytes, group)
