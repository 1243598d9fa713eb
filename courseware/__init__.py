"""The course's tooling around the engine: the exercise generator's command, releases, the bug zoo,
the self-check, the tiny model, the benchmarks, the trace viewer and the tutorial build.

What a lab is and how a student's code is read and scored lives in `labkit`, which this package
and `grading` both import. Layering (tests/test_layering.py): `reference` <- `labkit` <-
`courseware` <- `grading` <- `inferlab` (the CLI); each imports only packages to its left, and
nothing imports the CLI.
"""
