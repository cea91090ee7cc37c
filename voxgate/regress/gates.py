"""Gates: a measured number against a threshold, PASS / FAIL / SKIP, with a suggested fix.

`load_gates` reads the one threshold file (`gates.toml`, shipped in this package, or another
given by path); `evaluate` is pure: metrics in, one `GateResult` per gate out.
"""

from __future__ import annotations

import operator
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from voxgate.types import InvalidRequest

Status = Literal["PASS", "FAIL", "SKIP"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
}


class GateConfigError(InvalidRequest):
    """The threshold file is missing, unreadable or inconsistent."""

    code = "gate_config_error"


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    op: str
    threshold: float
    unit: str = ""
    what: str = ""
    hint: str = ""


@dataclass(frozen=True, slots=True)
class GateResult:
    name: str
    status: Status
    value: float | None
    threshold: float
    op: str
    unit: str
    hint: str
    where: str = ""  # which case gave the value, when one did

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"


def default_config_path() -> Path:
    return Path(str(resources.files("voxgate.regress") / "gates.toml"))


def read_config(path: Path | None = None) -> dict[str, Any]:
    """The whole threshold file as a dict (default: the packaged gates.toml)."""
    path = path or default_config_path()
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise GateConfigError(f"cannot read gate config {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise GateConfigError(f"gate config {path} is not valid TOML: {exc}") from None


def load_gates(
    config: Mapping[str, Any], suite: str, engine: str | None = None, device: str | None = None
) -> list[Gate]:
    """The gates of `suite` (e.g. "tts") in file order, with the overrides of `engine`, then
    of `engine.device` (e.g. `qwen3.cpu`), applied."""
    table = config.get(suite, {})
    engines = table.get("engines", {})
    overrides = {**engines.get(engine or "", {}).get("gates", {}),
                 **engines.get(f"{engine}.{device}", {}).get("gates", {})}  # fmt: skip
    gates = []
    for name, raw in table.get("gates", {}).items():
        if raw.get("op") not in _OPS or not isinstance(raw.get("threshold"), int | float):
            raise GateConfigError(f"gate {suite}.{name} needs op (one of {', '.join(_OPS)}) and a numeric threshold")
        gate = Gate(name, raw["op"], float(raw["threshold"]), raw.get("unit", ""), raw.get("what", ""),
                    raw.get("hint", ""))  # fmt: skip
        gates.append(replace(gate, threshold=float(overrides[name])) if name in overrides else gate)
    unknown = set(overrides) - {g.name for g in gates}
    if unknown:
        raise GateConfigError(f"{suite}.engines.{engine} overrides unknown gates: {', '.join(sorted(unknown))}")
    if not gates:
        raise GateConfigError(f"no gates for {suite!r} in the gate config")
    return gates


def evaluate(
    metrics: Mapping[str, float | None], gates: Sequence[Gate], where: Mapping[str, str] | None = None
) -> list[GateResult]:
    """Judge each gate on `metrics[gate.name]`: a missing or None value is SKIP."""
    results = []
    for gate in gates:
        value = metrics.get(gate.name)
        if value is None:
            status: Status = "SKIP"
        else:
            status = "PASS" if _OPS[gate.op](float(value), gate.threshold) else "FAIL"
        results.append(GateResult(gate.name, status, value, gate.threshold, gate.op, gate.unit, gate.hint,
                                  (where or {}).get(gate.name, "")))  # fmt: skip
    return results


def verdict(results: Sequence[GateResult]) -> Literal["PASS", "FAIL"]:
    """PASS when no gate failed (skipped gates do not fail a run)."""
    return "PASS" if all(r.passed for r in results) else "FAIL"


def failed(results: Sequence[GateResult]) -> list[str]:
    return [r.name for r in results if r.status == "FAIL"]
