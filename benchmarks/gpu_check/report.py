"""What one check found, as one printed line and as flat JSON keys.

Every check ends in an ``Outcome``: PASS (the code path ran on the device and its measurement met the check's
condition), FAIL (it ran and did not, or it broke, or it overran its budget: ``detail`` says which) or SKIP (it
could not run here: no CUDA, no MPS daemon, no mlflow; ``detail`` says why). ``figures`` are the measured
numbers, flat, under names that stay the same from run to run so two runs' JSON files compare key by key.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

STATUSES = ("PASS", "FAIL", "SKIP")
WIDTH = 120  # one line per item fits a 120-column terminal
_HEAD = 18  # "[PASS] 2 pool     " : status, number and name


@dataclass(frozen=True)
class Outcome:
    """One check's verdict: ``figure`` is the measured headline (a few words), ``figures`` every measured number."""

    item: str
    status: str
    figure: str = ""
    detail: str = ""
    figures: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}: choose one of {STATUSES}")

    def line(self, number: int | str = "") -> str:
        """``[PASS] 2 pool     <figure> | <detail>`` shortened to ``WIDTH`` columns (the JSON keeps it whole)."""
        text = " | ".join(part for part in (self.figure, self.detail) if part)
        head = f"[{self.status}] {number} {self.item:<9}"[:_HEAD].ljust(_HEAD)
        body = f"{text} ({self.seconds:.0f} s)" if self.seconds >= 0.5 else text
        return head + textwrap.shorten(" ".join(body.split()), WIDTH - _HEAD, placeholder=" ...")

    def to_json(self) -> dict[str, Any]:
        """The outcome as the flat keys ``<item>_status``, ``<item>_figure``, ``<item>_detail``, ``<item>_seconds``
        and ``<item>_<figure name>`` for each measured number (NaN and infinities as null)."""
        out: dict[str, Any] = {f"{self.item}_status": self.status, f"{self.item}_figure": self.figure,
                               f"{self.item}_detail": self.detail, f"{self.item}_seconds": round(self.seconds, 3)}
        for key, value in self.figures.items():
            out[f"{self.item}_{key}"] = _plain(value)
        return out

    @classmethod
    def from_json(cls, item: str, data: Mapping[str, Any]) -> "Outcome":
        """The outcome ``to_json`` wrote for ``item`` (how a check's subprocess hands its result back)."""
        prefix = f"{item}_"
        own = {"status", "figure", "detail", "seconds"}
        figures = {k[len(prefix):]: v for k, v in data.items()
                   if k.startswith(prefix) and k[len(prefix):] not in own}
        return cls(item, data[f"{prefix}status"], data.get(f"{prefix}figure", ""), data.get(f"{prefix}detail", ""),
                   figures, float(data.get(f"{prefix}seconds", 0.0)))


def _plain(value: Any) -> Any:
    """A JSON value: numpy scalars as numbers, non-finite floats as None, tuples as lists."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def verdict(item: str, failures: Sequence[str], figure: str, figures: Mapping[str, Any]) -> Outcome:
    """PASS when no condition failed, else FAIL naming each failed condition in ``detail``."""
    return Outcome(item, "FAIL" if failures else "PASS", figure, "; ".join(failures), figures)


def flat_json(outcomes: Sequence[Outcome], **run: Any) -> dict[str, Any]:
    """The run's facts (``run``: cuda, device, quick, ...) and every outcome's keys, in one flat object."""
    out: dict[str, Any] = {k: _plain(v) for k, v in run.items()}
    out["passed"] = sum(o.status == "PASS" for o in outcomes)
    out["failed"] = sum(o.status == "FAIL" for o in outcomes)
    out["skipped"] = sum(o.status == "SKIP" for o in outcomes)
    for outcome in outcomes:
        out.update(outcome.to_json())
    return out
