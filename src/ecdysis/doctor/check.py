"""One finding of `ecdysis doctor` (see the package's docstring for what each status means)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["ok", "info", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, what was found, and what to do about it (empty when ok)."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
