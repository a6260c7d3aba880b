"""Quantization: annotate -> observe (streaming calibration) -> scheme -> refine (target rules) -> write."""
