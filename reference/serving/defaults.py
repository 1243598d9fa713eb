"""The server's defaults, in a module that imports nothing, so the CLI's parser can show them cheaply."""

MAX_WAITING_REQUESTS = 256
# A 40,960-token prompt takes about 330 KB as JSON token ids, and about as much as text (more with
# \u escapes). The limit is also what the event loop may wait for: JSON is parsed in a worker thread,
# but the parser holds the GIL (docs/serving.md has the measured cost per MB).
MAX_REQUEST_BYTES = 2**20
# Below the 30 s a container runtime or systemd waits after SIGTERM before it kills: the last chunks
# must go out before that.
DRAIN_TIMEOUT_S = 10.0
