"""lazybatch: layer-wise lazy batching for Triton Inference Server."""
__version__ = "0.1.0"
