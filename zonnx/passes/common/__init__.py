"""General graph passes: opset upgrade, shape inference, folding, clean-up."""
