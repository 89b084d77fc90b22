"""The forms of the `device` and `device_map` options, checked without torch (the API and the
settings import this; the checks against the machine live in extension/plan/devices.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import InvalidOptionError

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # N: the number of a GPU
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's names
MAP_DEVICES = ("cuda:N", "cpu", "disk")  # what a JSON device map may name per module
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:(0|[1-9][0-9]{0,2}))$")
_MAP_DEVICE = re.compile(r"^(cpu|disk|cuda:(0|[1-9][0-9]{0,2}))$")


def device_problem(value: Any) -> str | None:
    """What is wrong with a device value's form (None: nothing), without asking for a GPU."""
    if not isinstance(value, str) or not _DEVICE.match(value):
        return f"must be {_either(DEVICES)} (N the number of a GPU), got {value!r}"
    return None


def parse_device_map(value: Any) -> str | dict | None:
    """None for "none", a strategy name, or a {module: device} dict; InvalidOptionError otherwise."""
    if isinstance(value, str) and value in ("none", *DEVICE_MAP_STRATEGIES):
        return None if value == "none" else value
    problem = (
        f"must be none, {', '.join(DEVICE_MAP_STRATEGIES)} or a JSON object mapping module names to "
        f"devices ({_either(MAP_DEVICES)}), e.g. {{\"model.embed_tokens\": \"cuda:0\", ...}}; got {value!r}"
    )
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        raise InvalidOptionError(option="device_map", problem=problem)
    try:
        mapping = json.loads(value)
    except json.JSONDecodeError as exc:
        raise InvalidOptionError(option="device_map", problem=f"is not valid JSON ({exc.msg} at character {exc.pos}); {problem}") from None
    if not isinstance(mapping, dict) or not mapping:
        raise InvalidOptionError(option="device_map", problem=problem)
    bad = [f"{k!r}: {v!r}" for k, v in mapping.items() if not isinstance(k, str) or not isinstance(v, str) or not _MAP_DEVICE.match(v)]
    if bad:
        raise InvalidOptionError(option="device_map", problem=f"has entries that are not module: device ({_either(MAP_DEVICES)}): {', '.join(bad[:3])}")
    return mapping


def device_map_problem(value: Any) -> str | None:
    try:
        parse_device_map(value)
    except InvalidOptionError as exc:
        return exc.problem
    return None


def _either(values: tuple[str, ...]) -> str:
    return f"{', '.join(values[:-1])} or {values[-1]}"
