# Generated from reference/models/__init__.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Model definitions (Qwen3) and weight loading from Hugging Face folders."""
