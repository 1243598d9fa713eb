"""SCHEDULED logs the sequence's own block_table list, which a later decode step appends to."""
EDITS = {
    "lab1.emit_scheduled": [
        ("block_table=list(seq.block_table)", "block_table=seq.block_table"),
    ],
}
