"""Multi-process inference: tensor parallelism and prefill/decode disaggregation.

`parallel_state` holds this process's rank in its tensor-parallel group,
`tp_runner` starts and drives the worker processes of a TP engine, and
`disaggregation` runs a prefill engine and a decode engine in two processes
joined by a KV transfer (`kv_transfer`). See docs/distributed.md.
"""
