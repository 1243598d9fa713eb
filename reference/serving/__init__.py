"""Serving the engine over HTTP: an OpenAI-compatible API, SSE streaming and Prometheus metrics.

Imported only by `inferlab serve` (FastAPI, uvicorn and prometheus_client are needed here alone).
"""
