"""Model definitions (Qwen3) and weight loading from Hugging Face folders."""
