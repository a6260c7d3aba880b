"""Accuracy recovery on the float model before quantization (SmoothQuant, cross-layer equalization)."""
