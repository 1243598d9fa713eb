"""Multi-process inference: tensor parallelism and prefill/decode disaggregation, built on the engine.

`tp_runner` starts and drives the worker processes of a TP engine (each rank's
place in its group is `reference.parallel_state`, which the layers read),
`disaggregation` runs a prefill engine and a decode engine in two processes
joined by a KV transfer (`kv_transfer`), and `processes` starts and stops
those processes. Nothing below this package imports it. See docs/distributed.md.
"""
