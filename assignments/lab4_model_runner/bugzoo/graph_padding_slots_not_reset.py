"""Replay leaves padding rows with an earlier, larger batch's slots: they overwrite its K/V (CPU and GPU tests)."""
GRADED_ON_GPU = True     # the CPU public tests catch it; the grader grades this region only on a GPU
EDITS = {
    "lab4.graph_replay": [
        ('s["slot_mapping"][:bucket].fill_(-1)', "pass"),
    ],
}
