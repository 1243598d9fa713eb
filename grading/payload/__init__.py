"""Files copied verbatim into every grading harness (see grading.harness); the grader imports only constants from them."""
