"""The most recently freed block is handed out first, evicting the freshest cached prefixes."""
EDITS = {
    "lab2.take_free_block": [
        ("popitem(last=False)", "popitem(last=True)"),
    ],
}
