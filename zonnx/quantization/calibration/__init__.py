"""Streaming calibration: readers, the one-session collector, per-tensor statistics and range methods."""
