"""The simulated NPU: targets, partitioner, compiler and execution provider (zonnx.backend)."""
