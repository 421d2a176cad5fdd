"""One finding of the doctor: a check's name, its status, what it saw and the fix."""

from __future__ import annotations

from dataclasses import dataclass

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
SKIP = "SKIP"  # the check does not apply here (no Slurm, no hostfile): neither passed nor failed


@dataclass(frozen=True)
class Result:
    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}
