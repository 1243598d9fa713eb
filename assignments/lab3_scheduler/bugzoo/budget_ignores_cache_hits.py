"""A prompt's cost against the token budget ignores the tokens its prefix-cache hit already covers."""
EDITS = {
    "lab3.admit": [
        ("num_new = len(seq) - self.block_manager.num_cached_tokens(seq)", "num_new = len(seq)"),
    ],
}
