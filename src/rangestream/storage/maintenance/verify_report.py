"""What a scan of a dataset found: each problem, and the report ``rangestream verify`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from rangestream.storage.maintenance.gc import Orphan

__all__ = ["Problem", "VerifyReport"]


@dataclass(frozen=True)
class Problem:
    """One piece of damage: where it is (an object URL, maybe a byte range) and what."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class VerifyReport:
    """What a scan checked and the damage it found (``ok`` when there is none)."""

    url: str
    kind: str = ""
    commit_id: str = ""
    shards: int = 0
    arrays: int = 0
    blocks: int = 0
    chunks: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: Versions under ``data/`` that are neither committed nor the one it replaced:
    #: not damage, but space that ``rangestream gc`` can reclaim.
    orphans: list[Orphan] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, where: str, message: str) -> None:
        self.problems.append(Problem(where, message))

    def lines(self) -> list[str]:
        """The report as printed by ``rangestream verify``."""
        out = [
            f"dataset   {self.url}",
            f"kind      {self.kind or '?'}",
            f"commit    {self.commit_id or '?'}",
            f"checked   {self.arrays} arrays in {self.shards} shards: {self.blocks} blocks, "
            f"{self.chunks} inner chunks, {self.bytes:,} bytes",
        ]
        if self.orphans:
            size = sum(orphan.bytes for orphan in self.orphans)
            out.append(
                f"orphans   {len(self.orphans)} version(s) not part of the dataset, {size:,} "
                f"bytes (`rangestream gc {self.url}` lists them, --yes deletes them)"
            )
            out.extend(f"  {orphan.prefix}: {orphan.bytes:,} bytes" for orphan in self.orphans)
        if self.ok:
            out.append("result    OK: every checksum and index invariant holds")
        else:
            out.append(f"result    DAMAGED: {len(self.problems)} problem(s)")
            out.extend(f"  {problem}" for problem in self.problems)
        return out
