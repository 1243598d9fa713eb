# Generated from reference/__init__.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""InferLab reference engine: `from reference import LLM, SamplingParams`."""
from student_exercises.config import Config
from student_exercises.llm import LLM, StreamChunk
from student_exercises.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "Config", "StreamChunk"]
