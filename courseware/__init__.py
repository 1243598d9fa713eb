"""The course's tooling around the engine: the lab registry, exercise regions and their generator,
releases, the bug zoo, the self-check, the tiny model, the benchmarks and the tutorial build.

Layering (tests/test_layering.py): `reference` <- `courseware` <- `grading` <- `inferlab` (the CLI);
each imports only packages to its left, and nothing imports the CLI.
"""
