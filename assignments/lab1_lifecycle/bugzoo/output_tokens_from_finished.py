"""num_output_tokens is read from FINISHED, so an unfinished request counts 0."""
EDITS = {
    "lab1.request_metrics": [
        ('        num_output_tokens=num_tokens,\n', '        num_output_tokens=finished["num_output_tokens"] if finished else 0,\n'),
    ],
}
