"""The lab kit: what a lab is, and how a student's code is read and scored.

Shared by the course tooling (`courseware`: the generator, releases, the
self-check) and the autograder (`grading`), so the two read a student's tree
and score an item in one way:

- `labs`: the lab registry, derived from the `assignments/labN_<topic>/` folders;
- `regions`: the exercise-region markers in the engine's source;
- `tree`: the reference tree and the packages generated from it (stubs, releases, harnesses);
- `student_code`, `additions`, `locate`: reading a student's tree (region bodies, definitions added
  outside the regions) and naming the student's own file and line in an error;
- `rubric`, `scoring`: what is graded (rubric.json), and the one rule that turns tests passed into points;
- `score_plugin`: the pytest plugin that records each test's outcome for scoring;
- `release_code`: the code a lab's release ships, and its hash manifest.

It imports nothing of the course but itself, so a student release ships it whole.
Layering (tests/test_layering.py): `reference` <- `labkit` <- `courseware` <- `grading` <- `inferlab`.
"""
