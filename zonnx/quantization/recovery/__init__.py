"""Accuracy recovery for post-training quantization: cross-layer equalization and bias correction."""
