"""Keras models built for tests and benchmarks get trained-like statistics.

A fresh Keras BatchNormalization is an identity (mean 0, variance 1, gamma 1, beta 0) and fresh biases are
zero, so folding or quantizing such a model would exercise nothing. Rule: with one seeded generator, in the
order of ``model.weights``, moving variances are drawn from U(0.5, 2), moving means, betas and biases from
N(0, 0.2), gammas from U(0.5, 1.5); other weights keep their seeded initial values.
"""

from __future__ import annotations

__all__ = ["randomize_statistics"]

from typing import Any

import numpy as np


def randomize_statistics(model: Any, seed: int = 0) -> Any:
    """Assign the module docstring's values to ``model``'s BatchNormalization statistics and biases, in place."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        name, shape = w.path if hasattr(w, "path") else w.name, tuple(w.shape)
        if "moving_variance" in name:
            w.assign(rng.uniform(0.5, 2.0, shape).astype("float32"))
        elif "moving_mean" in name or "bias" in name or "beta" in name:
            w.assign(rng.normal(0.0, 0.2, shape).astype("float32"))
        elif "gamma" in name:
            w.assign(rng.uniform(0.5, 1.5, shape).astype("float32"))
    return model
