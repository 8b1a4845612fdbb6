"""The exactness gate, digests and reference JSON of pp4_worker on the CPU (eager runners)."""
import json

import pytest

torch = pytest.importorskip("torch")

from pp4_worker.harness import gate  # noqa: E402
from pp4_worker.model import states as state_io  # noqa: E402
from pp4_worker.model.config import MODES, SWITCH, TINY_GEOMETRY, CellKey, ModelSettings  # noqa: E402
from pp4_worker.model.draft import DraftWorker  # noqa: E402
from pp4_worker.model.graphs import EagerRunner, build_runners  # noqa: E402
from pp4_worker.model.model import TensorParallelDraft  # noqa: E402

BATCHES, DEPTHS = [1, 2], [4]


@pytest.fixture(scope="module")
def setup():
    model = TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=40), torch.device("cpu"))
    worker = DraftWorker(model)
    states = state_io.synthetic_states(worker, 3) + state_io.capture_states(worker, 3)
    cells = [CellKey(b, d, m) for b in BATCHES for d in DEPTHS for m in MODES]
    return worker, states, build_runners(worker, cells, graphs=False)


def _gate(setup, runners=None):
    worker, states, eager = setup
    return gate.run_gate(worker, runners or eager, None, states, BATCHES, DEPTHS, log=lambda *_: None)


def test_gate_passes_and_digests_are_reproducible(setup):
    a = _gate(setup)
    assert a.ok, [f.describe() for f in a.failures]
    assert a.batches == 2 * 6 and a.checks > 100
    assert a.state_sources == {"synthetic": 3, "captured": 3}
    assert sorted(a.digests) == sorted(CellKey(b, d, m).name for b in BATCHES for d in DEPTHS for m in MODES)
    assert _gate(setup).digests == a.digests
    assert len(set(a.digests.values())) == len(a.digests)


class _Corrupting(EagerRunner):
    """A switch runner that damages what a T0 row returns: the gate must notice."""

    def __init__(self, base, damage):
        super().__init__(base.worker, base.cell)
        self.damage = damage

    def run(self):
        super().run()
        self.damage(self.outputs)


def _damaged(setup, damage):
    worker, states, eager = setup
    runners = dict(eager)
    cell = CellKey(2, 4, SWITCH)
    runners[cell] = _Corrupting(eager[cell], damage)
    return _gate(setup, runners)


def test_gate_fails_on_a_t0_row_that_differs_from_greedy(setup):
    def damage(out):
        out.confidences[0, 2] = out.confidences[0, 2] * 0.5

    r = _damaged(setup, damage)
    assert not r.ok
    f = next(f for f in r.failures if f.check == "switch-all-T0==greedy")
    assert f.cell == "B2-D4-switch" and f.row == 0 and "confidences differ" in f.describe()
    assert all(f.cell == "B2-D4-switch" for f in r.failures)


def test_gate_fails_on_q_payload_in_a_t0_row(setup):
    worker = setup[0]

    def damage(out):
        if not bool(worker.inputs.t1_mask[1]):
            out.q_payload[1, 0] = 0.25

    r = _damaged(setup, damage)
    checks = {f.check for f in r.failures}
    assert "switch-all-T0 q==0" in checks and "switch-10 T0 q==0" in checks
    assert {f.row for f in r.failures if f.check == "switch-all-T0 q==0"} == {1}


def test_gate_fails_on_unwritten_outputs(setup):
    def damage(out):
        out.proposals[1, 3] = -7  # the poison value: as if the call had not written it

    r = _damaged(setup, damage)
    assert any(f.check == "outputs-written" and f.row == 1 for f in r.failures)


def test_reference_json_round_trip(setup, tmp_path):
    res = _gate(setup)
    ident = {"torch": "t", "cuda": "c", "gpu": "g"}
    path = tmp_path / "ref.json"
    gate.write_reference(str(path), res.digests, ident, "cfg")
    doc = json.loads(path.read_text())
    assert set(doc) == {"format", "made_with", "config_sha256", "cells"}
    assert doc["made_with"] == ident and doc["cells"] == res.digests
    assert gate.check_reference(str(path), res.digests, ident, "cfg") == []
    # one changed digest fails that cell, and says the runtime differed
    bad = dict(res.digests)
    bad["B1-D4-greedy"] = "0" * 64
    fails = gate.check_reference(str(path), bad, dict(ident, gpu="other"), "cfg")
    assert [f.cell for f in fails] == ["B1-D4-greedy"]
    assert "gpu 'g' -> 'other'" in fails[0].detail
    # another configuration is refused as a whole
    fails = gate.check_reference(str(path), res.digests, ident, "other-cfg")
    assert len(fails) == 1 and "another configuration" in fails[0].detail
    # a subset of cells checks only those; a cell the reference lacks fails
    sub = {k: v for k, v in res.digests.items() if k.startswith("B1")}
    assert gate.check_reference(str(path), sub, ident, "cfg") == []
    fails = gate.check_reference(str(path), dict(sub, **{"B9-D4-greedy": "x"}), ident, "cfg")
    assert fails and "absent from the reference" in fails[-1].detail


def test_config_fingerprint_changes_with_model(setup):
    worker = setup[0]
    other = TensorParallelDraft(ModelSettings(TINY_GEOMETRY, context=40, weight_seed=1), torch.device("cpu"))
    assert other.fingerprint() != worker.model.fingerprint()
    assert gate.config_fingerprint("a", "b") != gate.config_fingerprint("a", "c")
