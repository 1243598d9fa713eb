"""InferLab course tooling."""
