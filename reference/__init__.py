"""InferLab reference engine: `from reference import LLM, SamplingParams`."""
from reference.config import Config
from reference.llm import LLM, StreamChunk
from reference.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "Config", "StreamChunk"]
