# Generated from reference/layers/__init__.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Building blocks of the model: attention over the paged KV cache, sampling."""
