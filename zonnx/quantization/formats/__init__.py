"""Writers: the only code that inserts quantization nodes (QDQ, QOperator, FixNeuron, VitisQDQ)."""
