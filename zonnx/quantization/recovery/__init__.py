"""Accuracy recovery for post-training quantization: SmoothQuant, cross-layer equalization, bias correction, fast
finetune."""
