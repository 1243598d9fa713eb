"""A short differential fuzz run against transformers (fixed seeds; `scripts/fuzz_engine.py` runs more)."""
from __future__ import annotations

import pytest

from courseware.engine_fuzz import run_case

CI_SEEDS = range(6)


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_random_case_matches_transformers(seed, tmp_path, tiny_model_dir):
    run_case(seed, tmp_path, tiny_model_dir)
