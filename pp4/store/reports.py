"""What the store's upkeep reports: stats, gc and verify (pp4/store/usage.py, verify.py). Apart from
the records, so that a compile, which never runs them, does not load them."""

from __future__ import annotations

import attrs


@attrs.frozen
class StoreStats:
    root: str
    entries: int  # action records
    objects: int
    bytes: int  # objects + records; what the bound limits
    bound: int
    tmp_files: int


@attrs.frozen
class GcResult:
    root: str
    bound: int
    bytes_before: int
    bytes_after: int
    records_evicted: int
    objects_evicted: int
    invalid_records_removed: int
    orphan_objects_removed: int
    tmp_files_removed: int
    manifest_entries_removed: int = 0  # entries whose action record is gone
    manifests_removed: int = 0  # manifests left with no entry
    input_sets_removed: int = 0  # sets no remaining entry names


@attrs.frozen
class Damage:
    path: str
    kind: str
    detail: str
    repaired: bool


@attrs.frozen
class VerifyReport:
    root: str
    objects_checked: int
    records_checked: int
    damage: tuple[Damage, ...]
    orphan_objects: int  # harmless leftovers of interrupted puts; gc removes them
    stale_tmp_files: int
    repair: bool

    @property
    def ok(self) -> bool:
        return not self.damage
