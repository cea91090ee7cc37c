"""End-to-end case files: what the user says in each call, and what the call must show.

The shipped set is `cases/cases.json` (package data); `--cases FILE` reads another file of
the same shape. A tier picks cases: `mini` and `fast` by each case's `tiers`, `nightly`
cycles the runnable P0 cases over `turns` fresh calls (`<id>@<n>`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from voxgate.types import VoxgateError

CASES_FILE = Path(__file__).parent / "cases" / "cases.json"
TIERS = ("mini", "fast", "nightly")
When = Literal["start", "after_reply", "over_reply"]


class CaseError(VoxgateError):
    code = "regress_bad_case"


@dataclass(frozen=True, slots=True)
class Step:
    text: str
    when: When = "start"  # the first step starts the call; later ones wait for the reply or talk over it
    # Said sentence by sentence with these pauses between (a multi-sentence question, issue 20);
    # empty: `text` said in one go.
    sentences: tuple[str, ...] = ()
    pauses_ms: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Noise:
    kind: str  # pink | white
    snr_db: float


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str  # spike | speed | distort (see inject.apply)
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    priority: Literal["P0", "P1"]
    steps: tuple[Step, ...]
    tiers: tuple[str, ...] = ()
    description: str = ""
    language: str = "en"
    noise: Noise | None = None
    anomaly: Anomaly | None = None
    expect: dict[str, Any] = field(default_factory=dict)  # replies, first_cut, input_spikes, input_drift, ...
    skip: str | None = None  # why the case cannot run here (reported, never silently dropped)

    @property
    def expected_replies(self) -> int:
        return int(self.expect.get("replies", len(self.steps)))


def _case(raw: dict[str, Any]) -> Case:
    try:
        steps = tuple(_step(i, s) for i, s in enumerate(raw["steps"]))
        noise = Noise(raw["noise"]["kind"], float(raw["noise"]["snr_db"])) if raw.get("noise") else None
        bad = raw.get("anomaly")
        anomaly = Anomaly(bad["kind"], dict(bad.get("params", {}))) if bad else None
        case = Case(id=raw["id"], priority=raw["priority"], steps=steps, tiers=tuple(raw.get("tiers", ())),
                    description=raw.get("description", ""), language=raw.get("language", "en"), noise=noise,
                    anomaly=anomaly, expect=dict(raw.get("expect", {})), skip=raw.get("skip"))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise CaseError(f"case {raw.get('id', '?')!r}: missing or bad field: {exc}") from None
    if case.priority not in ("P0", "P1"):
        raise CaseError(f"case {case.id!r}: priority must be P0 or P1, not {case.priority!r}")
    if not case.steps or case.steps[0].when != "start" or any(s.when == "start" for s in case.steps[1:]):
        raise CaseError(f"case {case.id!r}: the first step (and only it) starts the call")
    if any(s.when not in ("start", "after_reply", "over_reply") for s in case.steps):
        raise CaseError(f"case {case.id!r}: a step's 'when' is start, after_reply or over_reply")
    if any(s.sentences and len(s.pauses_ms) != len(s.sentences) - 1 for s in case.steps):
        raise CaseError(f"case {case.id!r}: a step with sentences needs one pause between each two")
    if any(p < 0 for s in case.steps for p in s.pauses_ms):
        raise CaseError(f"case {case.id!r}: a pause is >= 0 ms")
    return case


def _step(i: int, raw: dict[str, Any]) -> Step:
    """`{"text": ...}`, or `{"sentences": [...], "pauses_ms": [...]}` (the text is their join)."""
    when = raw.get("when", "start" if i == 0 else "after_reply")
    if "sentences" not in raw:
        return Step(raw["text"], when)
    sentences = tuple(str(s) for s in raw["sentences"])
    return Step(" ".join(sentences), when, sentences, tuple(int(p) for p in raw.get("pauses_ms", ())))


def load_cases(path: Path | None = None) -> list[Case]:
    """Every case of a case file (default: the shipped one), checked."""
    source = path or CASES_FILE
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CaseError(f"cannot read case file {source}: {exc}") from None
    cases = [_case(raw) for raw in data.get("cases", [])]
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise CaseError(f"case ids repeat in {source}")
    return cases


def select(cases: list[Case], tier: str, turns: int = 20, only: list[str] | None = None) -> list[Case]:
    """The cases a tier runs (skipped ones included, to be reported); `only` narrows by id."""
    if tier not in TIERS:
        raise CaseError(f"unknown tier {tier!r}; known: {', '.join(TIERS)}")
    if only:
        unknown = sorted(set(only) - {c.id for c in cases})
        if unknown:
            raise CaseError(f"no case named {', '.join(unknown)}")
        cases = [c for c in cases if c.id in only]
    if tier != "nightly":
        return [c for c in cases if tier in c.tiers or only]
    pool = [c for c in cases if c.priority == "P0" and c.skip is None]
    if not pool:
        raise CaseError("the nightly tier needs at least one runnable P0 case")
    return [replace(pool[i % len(pool)], id=f"{pool[i % len(pool)].id}@{i + 1}") for i in range(turns)]
