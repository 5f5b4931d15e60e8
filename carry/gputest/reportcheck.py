"""What `verify` says of a report beside its artifact (a test report's, a suite report's): whether it belongs there."""

from __future__ import annotations

from typing import Any

from carry.util.record import record


@record
class ReportCheck:
    """Whether a report belongs to the artifact beside it; `lines()` says what was compared (each kind of report its
    own `described()` rows)."""

    subject: str
    report: Any
    mismatches: tuple[str, ...]

    beside = "artifact"  # what the report belongs to, as the last line names it

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def described(self) -> list[str]:
        raise NotImplementedError

    def lines(self) -> list[str]:
        rows = [f"{self.subject}:", *self.described()]
        rows += [f"  MISMATCH {mismatch}" for mismatch in self.mismatches]
        rows.append(f"  report belongs to the {self.beside} beside it" if self.ok else "  NOT verified")
        return rows
