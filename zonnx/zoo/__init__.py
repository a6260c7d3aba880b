"""Real models for tests, benchmarks and the default build: built locally, cached on disk, rebuilt when missing."""

from zonnx.zoo.registry import ZOO, ZooEntry, cache_dir, get, names, sample_inputs

__all__ = ["ZOO", "ZooEntry", "cache_dir", "get", "names", "sample_inputs"]
