#!/usr/bin/env bash
# InferLab autograder: Gradescope runs this once, as root, when it builds the image
# (the bundle is unzipped in $ROOT/source). Written by `inferlab grade package` (grading/bundle.py).
#
# Installs Python if missing, then into $ROOT/venv torch==@TORCH_VERSION@ first (the CPU wheel: an
# unpinned torch pulls GBs of CUDA wheels), then requirements.txt (pinned), and builds the tiny model.
# INFERLAB_SETUP_REUSE=1 skips apt and pip when $INFERLAB_PYTHON (default python3) already imports
# every dependency (CI, a TA's own machine).
set -euo pipefail
ROOT="${INFERLAB_AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
PY="${INFERLAB_PYTHON:-python3}"
CHECK="import @GRADER_IMPORTS@"

if [ "${INFERLAB_SETUP_REUSE:-0}" = 1 ] && "$PY" -c "$CHECK" 2>/dev/null; then
    echo "setup: $PY already imports every dependency; nothing installed"
else
    if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then     # Debian's python3 lacks ensurepip
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 python3-venv python3-pip
    fi
    python3 -m venv "$ROOT/venv"
    PY="$ROOT/venv/bin/python"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "torch==@TORCH_VERSION@" --index-url "@TORCH_INDEX@"
    "$PY" -m pip install -q -r "$SOURCE/requirements.txt"
    "$PY" -c "$CHECK"
fi
"$PY" -c 'import sys; print(sys.executable)' > "$SOURCE/.python"
INFERLAB_CACHE="$ROOT/cache" PYTHONPATH="$SOURCE/course" "$PY" -c \
    "from courseware.tiny_model import ensure_tiny_model; print('setup: tiny model in', ensure_tiny_model())"
echo "setup: done ($(cat "$SOURCE/.python"))"
