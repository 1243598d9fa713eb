"""Runnable code behind every listing and figure in the lecture slides (see README.md)."""
