"""Accuracy recovery for post-training quantization: cross-layer equalization, bias correction, fast finetune."""
