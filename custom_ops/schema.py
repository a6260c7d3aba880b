"""What a zonnx op is: attribute schema (defaults and checks), function builder and numpy reference kernel."""

from __future__ import annotations

__all__ = [
    "ZONNX_DOMAIN",
    "ZONNX_VERSION",
    "AttrSpec",
    "OpDefinition",
    "BIT_WIDTH",
    "POS",
    "SIGNED",
    "NARROW",
    "ROUND_MODE",
    "check_grid",
]

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx

from zonnx.errors import OptionError, did_you_mean

from . import grid

logger = logging.getLogger(__name__)

#: Domain of the zonnx ops, and the opset version models import it at.
ZONNX_DOMAIN = "com.zonnx"
ZONNX_VERSION = 1


@dataclasses.dataclass(frozen=True)
class AttrSpec:
    """One attribute: int or str, a default (None: required), an allowed range or set of names.

    ``canonical`` maps accepted spellings (aliases) of a str value to one of ``choices``.

    ``derive`` computes the default from the other (already checked) attributes when the static
    default would be wrong for them (VitisQuantizeLinear's storage type); the FunctionProto still
    declares the static ``default``.
    """

    name: str
    kind: type
    default: int | str | None
    doc: str
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()
    canonical: Callable[[str], str | None] | None = None
    derive: Callable[[Mapping[str, Any]], int | str] | None = None

    def check(self, value: Any, where: str) -> int | str:
        """Return the canonical value or raise OptionError naming ``where`` and the allowed values."""
        if self.kind is int:
            if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
                raise OptionError(
                    f"{where}: attribute {self.name}={value!r} must be an integer ({self.doc})."
                )
            value = int(value)
            if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
                raise OptionError(
                    f"{where}: attribute {self.name}={value} is out of range [{self.low}, {self.high}] "
                    f"({self.doc})."
                )
            return value
        if not isinstance(value, str):
            raise OptionError(f"{where}: attribute {self.name}={value!r} must be a string ({self.doc}).")
        canonical = self.canonical(value) if self.canonical else value
        if canonical is None or (self.choices and canonical not in self.choices):
            raise OptionError(
                f"{where}: attribute {self.name}={value!r} is not one of {', '.join(self.choices)}."
                + did_you_mean(value, self.choices)
            )
        return canonical


BIT_WIDTH = AttrSpec(
    "bit_width", int, 8, "bits of the code grid", low=grid.MIN_BIT_WIDTH, high=grid.MAX_BIT_WIDTH
)
POS = AttrSpec(
    "pos",
    int,
    None,
    "fractional bits, scale = 2^-pos; clamp vai_q_onnx's 127 for all-zero tensors to 126",
    low=grid.MIN_POS,
    high=grid.MAX_POS,
)
SIGNED = AttrSpec("signed", int, 1, "1 for a signed grid, 0 for unsigned", low=0, high=1)
NARROW = AttrSpec(
    "narrow", int, 0, "1 for the symmetric signed range [-(2^(bw-1)-1), 2^(bw-1)-1]", low=0, high=1
)
ROUND_MODE = AttrSpec(
    "round_mode",
    str,
    "half_even",
    "rounding of x * 2^pos",
    choices=grid.ROUND_MODES,
    canonical=grid.canonical_round_mode,
)


def check_grid(attrs: Mapping[str, Any], where: str) -> None:
    """Cross-attribute rule of every grid: narrow applies to signed grids only."""
    if attrs.get("narrow") and not attrs.get("signed"):
        raise OptionError(f"{where}: narrow=1 needs signed=1 (an unsigned grid has no symmetric range).")


@dataclasses.dataclass(frozen=True)
class OpDefinition:
    """A zonnx op: attribute schema, ``build(opset, overload) -> FunctionProto``, numpy ``kernel``.

    ``overload_attr`` names the attribute whose canonical value selects the function body (the node's
    ``overload``); ops without one have a single body with overload "".
    """

    name: str
    doc: str
    attributes: tuple[AttrSpec, ...]
    build: Callable[[int, str], onnx.FunctionProto]
    kernel: Callable[..., np.ndarray]
    overload_attr: str | None = None
    cross_check: Callable[[Mapping[str, Any], str], None] | None = None

    def spec(self, name: str) -> AttrSpec | None:
        return next((a for a in self.attributes if a.name == name), None)

    @property
    def overloads(self) -> tuple[str, ...]:
        """Every overload a node of this op can select."""
        return grid.ROUND_MODES if self.overload_attr == "round_mode" else ("",)

    def resolve(self, attrs: Mapping[str, Any], where: str) -> dict[str, int | str]:
        """Check ``attrs`` and return every attribute with defaults filled in and names canonical."""
        names = [a.name for a in self.attributes]
        for key in attrs:
            if key not in names:
                raise OptionError(
                    f"{where}: {self.name} has no attribute {key!r} (it has {', '.join(names)})."
                    + did_you_mean(key, names)
                )
        resolved: dict[str, int | str] = {}
        for spec in self.attributes:
            if spec.name in attrs and attrs[spec.name] is not None:
                resolved[spec.name] = spec.check(attrs[spec.name], where)
            elif spec.default is None:
                raise OptionError(f"{where}: {self.name} needs attribute {spec.name!r} ({spec.doc}).")
        for spec in self.attributes:
            if spec.name not in resolved:
                value = spec.derive(resolved) if spec.derive else spec.default
                resolved[spec.name] = value  # type: ignore[assignment]
        if self.cross_check:
            self.cross_check(resolved, where)
        return {spec.name: resolved[spec.name] for spec in self.attributes}

    def overload_of(self, resolved: Mapping[str, Any]) -> str:
        """The function overload a node with these (resolved) attributes runs."""
        return str(resolved[self.overload_attr]) if self.overload_attr else ""

    def function(self, opset: int, overload: str = "") -> onnx.FunctionProto:
        """The FunctionProto of one overload at the model's default-domain opset."""
        if overload not in self.overloads:
            raise OptionError(f"{self.name}: no function body for overload {overload!r}.")
        return self.build(opset, overload)
