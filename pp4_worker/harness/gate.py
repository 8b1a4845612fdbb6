"""The exactness gate that must pass before anything is timed, and output digests.

For every batch size, the 24 request states form 24 batches (a window starting at
each state, wrapping round), and for every depth each batch checks:

* replay == replay for the greedy and the sampled graph;
* the switch graph fed all-T0 equals the greedy graph bit for bit (proposals,
  confidences) and carries an all-zero q payload;
* the switch graph fed all-T1 equals the sampled graph bit for bit (all outputs);
* batches of 2-4, both alternating masks: every T0 row equals greedy and has a
  zero q payload, every T1 row equals sampled;
* graph == eager for the greedy, sampled and switch cells (on CUDA);
* outputs are fully written (they are poisoned before every run), token ids in
  range, confidences in (0, 1], q beyond the depth exactly zero.

Each cell's digest is the sha256 of its outputs over all 24 batches in order (a
switch cell's under all-T0, all-T1 and both alternating masks); a reference JSON holds only those hashes plus the torch, CUDA and GPU that made them.
"""
from __future__ import annotations

import hashlib
import json

import attrs
import torch

from pp4_worker.model import sampling
from pp4_worker.model.config import GREEDY, SAMPLED, SWITCH, CellKey
from pp4_worker.model.draft import CellOutputs, DraftWorker
from pp4_worker.model.hashing import tensor_bytes

# The format keeps the name it had before the package became pp4_worker: references already written still check.
REFERENCE_FORMAT = "pp4.worker.reference/1"


@attrs.frozen
class GateFailure:
    check: str
    cell: str
    states: tuple[str, ...]
    row: int | None
    detail: str

    def describe(self) -> str:
        row = f" row {self.row}" if self.row is not None else ""
        return f"[{self.check}] cell {self.cell}{row} states {','.join(self.states)}: {self.detail}"


@attrs.define
class GateResult:
    failures: list[GateFailure] = attrs.Factory(list)
    checks: int = 0
    batches: int = 0
    digests: dict[str, str] = attrs.Factory(dict)
    graph_vs_eager: bool = False
    state_sources: dict[str, int] = attrs.Factory(dict)

    @property
    def ok(self) -> bool:
        return not self.failures


# ---------------------------------------------------------------------------- comparisons
def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _rows_differ(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    diff = (_bits(a) != _bits(b)).reshape(a.shape[0], -1).any(dim=1)
    return [i for i, d in enumerate(diff.tolist()) if d]


class _Checker:
    def __init__(self, result: GateResult, cell: CellKey, names: tuple[str, ...]):
        self.result, self.cell, self.names = result, cell, names

    def fail(self, check: str, row, detail: str) -> None:
        self.result.failures.append(GateFailure(check, self.cell.name, self.names, row, detail))

    def same(self, check: str, got: CellOutputs, want: CellOutputs, rows=None, fields=("proposals", "confidences")):
        self.result.checks += 1
        rows = set(range(got.proposals.shape[0]) if rows is None else rows)
        for field in fields:
            a, b = getattr(got, field), getattr(want, field)
            for r in _rows_differ(a, b):
                if r in rows:
                    self.fail(check, r, f"{field} differ: {a[r].tolist()} vs {b[r].tolist()}")

    def q_zero(self, check: str, got: CellOutputs, rows) -> None:
        self.result.checks += 1
        for r in rows:
            if (_bits(got.q_payload[r]) != 0).any():
                self.fail(check, r, f"T0 row carries a q payload {got.q_payload[r].tolist()}")

    def well_formed(self, got: CellOutputs, vocab: int, mode: str, t1_rows) -> None:
        self.result.checks += 1
        D = got.proposals.shape[1]
        p, c, q = got.proposals, got.confidences, got.q_payload
        for r in range(p.shape[0]):
            if ((p[r] < 0) | (p[r] >= vocab)).any():
                self.fail("outputs-written", r, f"token ids out of range (unwritten?): {p[r].tolist()}")
            if not bool(((c[r] > 0) & (c[r] <= 1)).all()):
                self.fail("outputs-written", r, f"confidences outside (0, 1]: {c[r].tolist()}")
            if (_bits(q[r, D:]) != 0).any():
                self.fail("q-padding-zero", r, f"q payload beyond depth {D} not zero: {q[r].tolist()}")
            sampled_row = mode == SAMPLED or (mode == SWITCH and r in t1_rows)
            want_q = c[r] if sampled_row else torch.zeros_like(c[r])
            if (_bits(q[r, :D]) != _bits(want_q)).any():
                self.fail("q-payload", r, f"q {q[r, :D].tolist()} expected {want_q.tolist()}")


# ---------------------------------------------------------------------------- the gate
def run_gate(worker: DraftWorker, runners: dict, eager: dict | None, states: list, batch_sizes, depths,
             log=print) -> GateResult:
    """runners: cell -> runner under test (graphs on CUDA, eager on CPU); eager: the
    eager runners to compare graphs with (None when runners are already eager)."""
    result = GateResult(graph_vs_eager=eager is not None)
    for s in states:
        result.state_sources[s.source] = result.state_sources.get(s.source, 0) + 1
    vocab = worker.model.g.vocab
    n = len(states)

    def run(runner, mask=None) -> CellOutputs:
        if mask is not None:
            worker.set_mask(mask)
        runner.outputs.poison()
        runner.run()
        return runner.outputs.to_host()

    for B in batch_sizes:
        windows = [[states[(k + j) % n] for j in range(B)] for k in range(n)]
        masks_alt = sampling.alternating_masks(B) if B >= 2 else ()
        for D in depths:
            cg, cs, cw = CellKey(B, D, GREEDY), CellKey(B, D, SAMPLED), CellKey(B, D, SWITCH)
            digest = {c: hashlib.sha256() for c in (cg, cs, cw)}
            failures_before = len(result.failures)
            for window in windows:
                for slot, state in enumerate(window):
                    worker.load_request(slot, state)
                names = tuple(s.name for s in window)
                result.batches += 1
                greedy, greedy2 = run(runners[cg]), run(runners[cg])
                smp, smp2 = run(runners[cs]), run(runners[cs])
                chk_g, chk_s, chk_w = (_Checker(result, c, names) for c in (cg, cs, cw))
                chk_g.same("replay==replay", greedy2, greedy, fields=("proposals", "confidences", "q_payload"))
                chk_s.same("replay==replay", smp2, smp, fields=("proposals", "confidences", "q_payload"))
                chk_g.well_formed(greedy, vocab, GREEDY, ())
                chk_s.well_formed(smp, vocab, SAMPLED, ())

                all_t0 = run(runners[cw], sampling.mask_all_t0(B))
                chk_w.same("switch-all-T0==greedy", all_t0, greedy)
                chk_w.q_zero("switch-all-T0 q==0", all_t0, range(B))
                chk_w.well_formed(all_t0, vocab, SWITCH, ())
                all_t1 = run(runners[cw], sampling.mask_all_t1(B))
                chk_w.same("switch-all-T1==sampled", all_t1, smp, fields=("proposals", "confidences", "q_payload"))
                digest_mask = sampling.alternating_masks(B)[0]
                switch_outs = [all_t0, all_t1]
                for mask in masks_alt:
                    t0 = [r for r in range(B) if not mask[r]]
                    t1 = [r for r in range(B) if mask[r]]
                    mixed = run(runners[cw], mask)
                    tag = sampling.mask_name(mask)
                    chk_w.same(f"switch-{tag} T0 rows==greedy", mixed, greedy, rows=t0)
                    chk_w.q_zero(f"switch-{tag} T0 q==0", mixed, t0)
                    chk_w.same(f"switch-{tag} T1 rows==sampled", mixed, smp, rows=t1,
                               fields=("proposals", "confidences", "q_payload"))
                    chk_w.well_formed(mixed, vocab, SWITCH, set(t1))
                    switch_outs.append(mixed)
                if eager is not None:
                    chk_g.same("graph==eager", run(eager[cg]), greedy, fields=("proposals", "confidences", "q_payload"))
                    chk_s.same("graph==eager", run(eager[cs]), smp, fields=("proposals", "confidences", "q_payload"))
                    sw_graph = run(runners[cw], digest_mask)
                    chk_w.same("graph==eager", run(eager[cw], digest_mask), sw_graph,
                               fields=("proposals", "confidences", "q_payload"))
                _digest_update(digest[cg], names, greedy)
                _digest_update(digest[cs], names, smp)
                for out in switch_outs:  # all-T0, all-T1, then each alternating mask
                    _digest_update(digest[cw], names, out)
            for c, h in digest.items():
                result.digests[c.name] = h.hexdigest()
            bad = len(result.failures) - failures_before
            log(f"  gate B={B} D={D}: {len(windows)} batches, {'OK' if not bad else f'{bad} FAILURES'}")
    return result


def _digest_update(h, names, out: CellOutputs) -> None:
    h.update(("|".join(names) + "\n").encode())
    for t in (out.proposals, out.confidences, out.q_payload):
        h.update(tensor_bytes(t))


# ---------------------------------------------------------------------------- reference JSON
def runtime_identity(device: torch.device) -> dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"torch": torch.__version__, "cuda": torch.version.cuda or "none", "gpu": gpu}


def config_fingerprint(model_fingerprint: str, states_digest: str) -> str:
    return hashlib.sha256(f"{model_fingerprint}|{states_digest}".encode()).hexdigest()


def write_reference(path: str, digests: dict[str, str], identity: dict, config_sha256: str) -> None:
    doc = {"format": REFERENCE_FORMAT, "made_with": identity, "config_sha256": config_sha256,
           "cells": dict(sorted(digests.items()))}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def check_reference(path: str, digests: dict[str, str], identity: dict, config_sha256: str) -> list[GateFailure]:
    """Compare this run's digests with a reference; every difference is a failure."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != REFERENCE_FORMAT:
        return [GateFailure("reference", "-", (), None, f"{path}: format {doc.get('format')!r}, expected {REFERENCE_FORMAT!r}")]
    if doc.get("config_sha256") != config_sha256:
        return [GateFailure("reference", "-", (), None,
                            f"{path} was made for another configuration (model, weights, states or --context)")]
    made = doc.get("made_with", {})
    drift = [f"{k} {made.get(k)!r} -> {identity.get(k)!r}" for k in ("torch", "cuda", "gpu") if made.get(k) != identity.get(k)]
    note = f" (reference made with other runtime: {'; '.join(drift)}; arithmetic may drift)" if drift else ""
    out = []
    for cell, want in sorted(doc.get("cells", {}).items()):
        got = digests.get(cell)
        if got is None:
            continue  # a run of fewer cells checks only the ones it ran
        if got != want:
            out.append(GateFailure("reference", cell, (), None, f"sha256 {got[:16]}.. != reference {want[:16]}..{note}"))
    missing = sorted(set(digests) - set(doc.get("cells", {})))
    if missing:
        out.append(GateFailure("reference", ",".join(missing), (), None, "cells absent from the reference"))
    return out
