"""(GPU) Padding rows of a replayed graph keep the slots of an earlier, larger batch and overwrite its K/V."""
GPU = True
EDITS = {
    "lab4.graph_replay": [
        ('s["slot_mapping"][:bucket].fill_(-1)', "pass"),
    ],
}
