"""``zonnx.errors.first_line``: the one line of a library's error that zonnx messages quote."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

from zonnx.errors import VerificationError, first_line
from zonnx.verify import check_loadable


def test_first_line_of_onnx_checker_error_drops_its_context() -> None:
    bad = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[2] x) => (float[2] y) { y = Relu(x, x) }'
    )
    with pytest.raises(onnx.checker.ValidationError) as err:
        onnx.checker.check_model(bad)
    assert "\n" in str(err.value)  # onnx adds "==> Context: ..." lines
    line = first_line(err.value)
    assert line.startswith("Node with schema(::Relu:14) has input size 2") and "\n" not in line
    assert "Context" not in line


def test_blank_space_is_dropped_and_an_empty_message_gives_the_class_name() -> None:
    assert first_line(ValueError("\n  first\nsecond\n")) == "first"
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line(KeyboardInterrupt()) == "KeyboardInterrupt"


def test_verify_quotes_one_line() -> None:
    """The VerificationError for a model onnx.checker rejects carries the checker's first line only."""
    bad = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[2] x) => (float[2] y) { y = Relu(x, x) }'
    )
    with pytest.raises(VerificationError, match=r"onnx.checker rejects the model: Node with schema") as err:
        check_loadable(bad)
    assert "\n" not in str(err.value)
