"""Accuracy recovery after quantization: algorithms that adjust a quantized model to its float model."""
