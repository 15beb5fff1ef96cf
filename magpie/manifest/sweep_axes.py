"""What a sweep varies (`SweepAxes`: `--sweep`, the YAML's `sweep:`, a `[[benchmark]]`'s `sweep`) and its points'
names; light enough for the manifest to import."""

from __future__ import annotations

import itertools
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_serializer, field_validator

AXES = ("concurrency", "request_rate", "input_len", "output_len")
DEFAULT_REPEATS = 3


class SweepAxes(BaseModel):
    """The values of each swept setting; the points are their product."""

    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] | None = None
    request_rate: list[float] | None = None
    input_len: list[int] | None = None
    output_len: list[int] | None = None

    @field_validator("request_rate", mode="before")
    @classmethod
    def _rates(cls, value):
        if isinstance(value, list):
            return [math.inf if v in ("inf", "Infinity") else v for v in value]
        return value

    @field_validator("concurrency", "request_rate", "input_len", "output_len")
    @classmethod
    def _values(cls, value, info):
        if value is None:
            return value
        if not value:
            raise ValueError(f"{info.field_name}: give at least one value")
        if any(v <= 0 for v in value):
            raise ValueError(f"{info.field_name}: every value must be above 0, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"{info.field_name}: a value is given twice in {value}")
        return value

    @field_serializer("request_rate")
    def _rates_in_strict_json(self, rates):
        return None if rates is None else ["inf" if math.isinf(r) else r for r in rates]

    def given(self) -> dict[str, list]:
        return {axis: getattr(self, axis) for axis in AXES if getattr(self, axis) is not None}

    def points(self) -> list[dict[str, Any]]:
        given = self.given()
        if not given:
            raise ValueError("a sweep needs at least one of " + ", ".join(AXES))
        return [dict(zip(given, values)) for values in itertools.product(*given.values())]


def parse_sweep(args: list[str]) -> SweepAxes:
    """`--sweep concurrency=1,2,4` (one axis per argument) as SweepAxes; ValueError with one line."""
    axes: dict[str, list[str]] = {}
    for arg in args:
        name, sep, values = arg.partition("=")
        if not sep or name not in AXES:
            raise ValueError(f"--sweep {arg!r}: give AXIS=V1,V2,... with AXIS one of {', '.join(AXES)}")
        if name in axes:
            raise ValueError(f"--sweep: {name} is given twice")
        axes[name] = [v.strip() for v in values.split(",") if v.strip()]
    try:
        return SweepAxes.model_validate(axes)
    except ValidationError as err:
        first = err.errors()[0]
        raise ValueError(f"--sweep {first['loc'][0]}: {first['msg'].removeprefix('Value error, ')}") from None


def label(point: dict[str, Any]) -> str:
    """A point's name, also its folder: `concurrency=4`, `concurrency=4,input_len=128`, `request_rate=inf`."""
    return ",".join(f"{axis}={_word(value)}" for axis, value in point.items())


def task_label(point: dict[str, Any]) -> str:
    """A point's part of its build task's name (doit's names take no `=`): `concurrency-4,input_len-128`."""
    return label(point).replace("=", "-")


def _word(value) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else (str(int(value)) if value == int(value) else repr(value))
    return str(value)
