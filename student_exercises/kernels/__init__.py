# Generated from reference/kernels/__init__.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Triton kernels for the GPU fast path (importable only where triton is installed).

On a CPU-only machine they run under `TRITON_INTERPRET=1` (the interpreter),
which is how CI checks them; the interpreter mishandles bf16, so interpreted
tests use fp32.
"""
