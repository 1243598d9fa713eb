"""InferLab's autograder: harness, sandboxed runner, golden outputs, judge, reports (docs/design.md §4).

The modules, in the order a grade is made:

- `paths`: where each lab's parts are (from `labkit.labs`) and what graded code may not see;
- (`labkit`: the rubric, reading a student's tree and the scoring rule, shared with the self-check);
- `submission`: finding submissions and cutting the student's region bodies out of them;
- `tree_walk`: the one walk of a submission's real tree (links, limits, odd names) that hashing and
  grading both read through;
- `harness`: a temp copy of the instructor's engine with those bodies spliced in;
- `spawn` (+ `zygote.py`): the graded processes, each in its own process group, killed at its deadline
  (the project's CI forks its public-suite runs from the same fork server);
- `scratch`: each graded process's scratch folder, under a quota on what it writes in total;
- `unfenced`: what stays open without Landlock, and the refusal to grade so unless the TA accepts it;
- `payload/`: what runs inside a graded process (fence, observation recorder, hidden tests' drivers),
  stored under the module names it runs as (`_inferlab_sandbox.py`, ...);
- `judge`: comparing observations with the golden outputs, in the grader, never importing student code;
- `golden`: building and checking the golden outputs;
- `items`, `throughput_check`, `report_check`: one rubric item to one result;
- `grade_run`: a whole class, in parallel, resumable (`inferlab grade run`);
- `report`: CSV, feedback, Gradescope JSON, summary, histogram;
- `nbgrader_bridge`: nbgrader's scores merged into the same rows.

Nothing in this package may be imported by a graded process: the sandbox refuses it.
"""
RESULT_FORMAT = 1
