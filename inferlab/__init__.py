"""The `inferlab` command (`inferlab.cli`): the one place that imports both `courseware` and `grading`."""
