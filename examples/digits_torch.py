"""The digits CNN as a PyTorch module for examples/digits_torch.toml (``source = "digits_torch.py:TrainedDigits"``).

``TrainedDigits()`` trains zonnx's DigitsCNN on scikit-learn's digits (a few seconds, deterministic);
a project of your own would load its checkpoint here instead (``self.load_state_dict(torch.load(...))``).
"""

from __future__ import annotations

import torch

from zonnx.zoo.digits import DigitsCNN, train_digits_cnn
from zonnx.zoo.torch_models import torch_threads


class TrainedDigits(DigitsCNN):
    """DigitsCNN with trained weights, in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        with torch_threads(1):  # tiny kernels: more threads only contend
            trained = train_digits_cnn().state_dict()
        with torch.no_grad():
            self.load_state_dict(trained)
        self.eval()
