"""A report beside its artifact (a test report, a suite report): reading its JSON, and whether it belongs there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carry.util.errors import BadInput, Failed
from carry.util.record import record

if TYPE_CHECKING:
    from carry.wheelbuild.verify import Verification


def read_json(path: Path, kind: str, made_by: str) -> Any:
    """A report's JSON; BadInput where there is none (saying what writes it), Failed where it cannot be read."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path}: no such report; {made_by} beside the wheel") from None
    except (OSError, ValueError) as exc:
        raise Failed(f"{path}: not a carry {kind} report ({exc})") from None


@record
class ReportCheck:
    """Whether a report belongs to the artifact beside it; `lines()` says what was compared (`described()`)."""

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

    def added_to(self, result: Verification, what: str, expected: str, note: str) -> Verification:
        """`verify` of a wheel with this report's mismatches (each of `what`, `expected` to be) and `note` added."""
        import dataclasses

        from carry.wheelbuild.verify import Mismatch

        mismatches = tuple(Mismatch(what, expected, m) for m in self.mismatches)
        return dataclasses.replace(result, mismatches=result.mismatches + mismatches, notes=result.notes + (note,))
