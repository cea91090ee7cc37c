"""A bounded, deterministic schemathesis run of a live server's `/openapi.json` (issue 16).

`fuzz(url, headers, examples)` loads the schema from the server with schemathesis's Python
API and sends every operation `examples` generated requests of each kind: valid ones
(positive: they fit the documented request schema) and invalid ones (negative). Hypothesis is
derandomized, has no example database and never shrinks, so a run sends the same requests
every time and takes a bounded time. No check raises inside the run: every response is
judged, and the findings come back together (the first example of each distinct one).

The judgement, per response:
- no 5xx, except a 503 that the operation documents (the server is busy, still starting, or
  has no LLM);
- `status_code_conformance`, `content_type_conformance`, `response_schema_conformance`: the
  status is documented, the content type is one documented for it, the body fits its schema.
An operation for which no valid request can be generated (a broken request schema, such as a
dangling `$ref`) is a finding too; one without inputs to get wrong has no invalid requests.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = (status_code_conformance, content_type_conformance, response_headers_conformance, response_schema_conformance)
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


@dataclass(frozen=True, slots=True)
class Finding:
    operation: str
    mode: str
    check: str
    status: int | None
    detail: str

    def __str__(self) -> str:
        return f"{self.operation} [{self.mode}] {self.check} -> {self.status}:\n    {self.detail}"


@dataclass(slots=True)
class Report:
    """What a run sent and found: requests per (operation, mode), responses per (operation,
    status), and the first finding of each (operation, check, status)."""

    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    findings: dict[tuple[str, str, int | None], Finding] = field(default_factory=dict)

    def add(self, finding: Finding) -> None:
        self.findings.setdefault((finding.operation, finding.check, finding.status), finding)

    def operations(self) -> set[str]:
        return {operation for operation, _ in self.sent}

    def summary(self) -> str:
        return "\n".join(str(f) for f in self.findings.values())


def fuzz(url: str, headers: dict[str, str], examples: int, schema_headers: dict[str, str] | None = None) -> Report:
    """Fuzz every operation of the server at `url` (sending `headers` with each request): its
    documented examples once each, then `examples` valid and `examples` invalid requests.
    `/openapi.json` is read with `schema_headers` (default: `headers`)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=schema_headers or headers)
    report = Report()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()  # raises if the schema has an operation it cannot read
            runs = [("example", strategy, 1) for strategy in operation.get_strategies_from_examples()]
            runs += [(mode.value, operation.as_strategy(generation_mode=mode), examples) for mode in MODES]
            for kind, strategy, count in runs:
                _run(operation, kind, strategy, count, session, headers, report)
    return report


def _run(operation: Any, kind: str, strategy: Any, count: int, session: requests.Session,
         headers: dict[str, str], report: Report) -> None:  # fmt: skip
    label = operation.label
    documented = set(operation.definition.raw.get("responses", {}))

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=strategy)
    def one(case: Any) -> None:
        report.sent[(label, kind)] += 1
        response = case.call(session=session, headers=headers, timeout=60)
        report.statuses[(label, response.status_code)] += 1
        status = response.status_code
        if status >= 500 and not (status == 503 and "503" in documented):
            report.add(Finding(label, kind, "not_a_server_error", status, _reproduce(case, response)))
        for check in CHECKS:
            try:
                case.validate_response(response, checks=[check], headers=headers)
            except (AssertionError, BaseExceptionGroup) as exc:
                report.add(Finding(label, kind, check.__name__, status, _first_line(exc)))

    try:
        one()
    except Unsatisfiable:
        if kind != GenerationMode.NEGATIVE.value:  # a broken schema; no invalid input is fine
            report.add(Finding(label, kind, "generation", None, "no valid request could be generated"))


def _reproduce(case: Any, response: requests.Response) -> str:
    return f"{response.text[:300]!r}\n    {case.as_curl_command()}"


def _first_line(exc: BaseException) -> str:
    """The failure's title and what was expected, without schemathesis's full report."""
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text[:600]
