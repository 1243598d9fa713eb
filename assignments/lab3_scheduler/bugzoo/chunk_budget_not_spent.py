"""(stretch) A continued prefill chunk is not charged to the step's token budget."""
EDITS = {
    "lab3.chunked_prefill": [
        ("budget -= seq.num_scheduled_tokens", "pass"),
    ],
}
