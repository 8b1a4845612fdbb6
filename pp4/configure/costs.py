"""What a build will cost: the measured durations known (this build's log, the shipped tables) and
the lines configure says them in."""

from __future__ import annotations

import os
from pathlib import Path

from pp4 import paths
from pp4.plan import estimate
from pp4.plan import modules as plan
from pp4.sizes import human_duration

DURATION_TABLES = paths.PACKAGE_DIR / "plan" / "durations"


def durations_known(builddir: Path, root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Durations from this build's .ninja_log, and the shipped table for known sources."""
    log = plan.read_ninja_log(builddir / ".ninja_log")
    table: dict[str, int] = {}
    for tsv in sorted(DURATION_TABLES.glob("*.tsv")):
        table.update(plan.read_duration_table(tsv))
    return log, table


def cost_line(plans: list[plan.ModulePlan], ordered, table: dict[str, int], jobs: int, scale: float = 1.0,
              scaled_on: int = 0, learned_on: int = 0) -> str:
    """What a cold build costs: CPU time, the wall time of ninja's order on `jobs` slots (each unit
    starts on the first free slot, as ninja starts them), the longest unit. The H200's figures are
    scaled by this build's log where it times enough of the table's units (scaled_on), else by
    this machine's speed learned from its builds (learned_on compiles: pp4/plan/estimate.py)."""
    times = [(p, s, plan.expected_ms(p, s, table, scale) / 1000, plan.measured_ms(p, s, table) is not None)
             for p, s in ordered]
    if not times:
        return "nothing to compile"
    slots = [0.0] * jobs
    for _, _, t, _ in times:
        i = min(range(jobs), key=slots.__getitem__)
        slots[i] += t
    p, s, longest, _ = max(times, key=lambda x: x[2])
    measured = sum(m for *_, m in times)
    source = (f"{measured} timed before" if measured == len(times) else
              f"{measured} timed before, {len(times) - measured} estimated from their text (pp4/plan/estimate.py)")
    return (f"a cold build: {len(times)} compiles ({source}), about {human_duration(sum(t for _, _, t, _ in times))} of CPU, "
            f"about {human_duration(max(slots))} on {jobs} job(s); the longest unit {os.path.relpath(s.source, p.extension.root)} "
            f"about {human_duration(longest)}. Objects found in the store cost a copy instead. Times are per-unit "
            "figures from this build's log, else the H200 machine's " +
            (f"times {scale:.2f} (the median of this machine's time over the H200's on the {scaled_on} units both "
             "have timed)" if scaled_on >= plan.MIN_UNITS_FOR_SCALE else
             f"times {scale:.2f} (this machine's CPU time over the H200's on the last {learned_on} units it compiled, "
             f"{estimate.speed_file()}; remove it to reset)" if learned_on >= estimate.SPEED_MIN_UNITS else
             f"as measured there (scaled to this machine once {plan.MIN_UNITS_FOR_SCALE} of its units are timed "
             f"here; {scaled_on} are): a slower CPU takes longer"))


def target_costs(ordered, table: dict[str, int], scale: float = 1.0) -> str | None:
    """The CPU each target costs cold, for a build of fewer than all of them (`ninja p2p`, or a
    `ninja wheel-TARGET`): None for a single target."""
    cpu: dict[str, float] = {}
    for p, s in ordered:
        cpu[p.extension.target] = cpu.get(p.extension.target, 0.0) + plan.expected_ms(p, s, table, scale) / 1000
    if len(cpu) < 2:
        return None
    costliest = sorted(cpu.items(), key=lambda tc: -tc[1])
    return "by target, cold: " + ", ".join(f"{t} about {human_duration(c)} of CPU" for t, c in costliest)

