"""Accuracy-budget search: per-layer sensitivity, then the cheapest mixed-precision plan within a budget."""
