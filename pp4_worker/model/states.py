"""Request states: what a batch slot holds before a call, synthetic or captured.

A state is one request's query block (5 token ids), its context length, the KV
cache of its first ``context_length`` positions for every layer and all KV heads
(logical layout [L, 2, kv_heads, ctx, D], independent of the TP split), and the
sampling seed of the call.

Captured states come from real runs of this worker: a seeded prompt is prefilled
through the model, then a few depth-5 calls (greedy or sampled) run with every
proposal accepted, each call's proposals becoming the next query block -- the KV
cache, context length and tokens after the last call are the state.  They are
saved with torch.save (one file each, plus a manifest of sha256 and the model
fingerprint) and are only valid for the model that made them.
"""
from __future__ import annotations

import hashlib
import json
import os

import attrs
import torch

from pp4_worker.model import hashing
from pp4_worker.model.config import GREEDY, QUERY_BLOCK, SAMPLED, CellKey
from pp4_worker.model.draft import CellOutputs, DraftWorker, run_prefill

# The format keeps the name it had before the package became pp4_worker: saved states still load.
STATE_FORMAT = "pp4.worker.states/1"
CAPTURE_CALLS = 3


@attrs.define
class RequestState:
    name: str
    source: str  # "synthetic" or "captured"
    query_tokens: torch.Tensor  # [QUERY_BLOCK] int64, CPU
    context_length: int
    kv: torch.Tensor  # [L, 2, kv_heads, context_length, D], CPU, model dtype
    seed: int  # signed 64-bit
    meta: dict = attrs.Factory(dict)


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _seed64(seed: int, index: int, domain: int) -> int:
    k1, k2 = hashing.stream_keys(seed, index, domain)
    return _signed64((k1 << 32) | k2)


def _token_ids(seed: int, stream: int, n: int, vocab: int) -> list[int]:
    k1, k2 = hashing.stream_keys(seed, stream, hashing.DOMAIN_STATES)
    return [hashing.mix32(hashing.mix32(i ^ k1) ^ k2) % vocab for i in range(n)]


def _context_for(index: int, capacity: int, stride: int) -> int:
    """Varied context lengths in (7/8 capacity, capacity]: masks see different lengths per row."""
    return capacity - (index * stride) % max(1, capacity // 8)


def synthetic_states(worker: DraftWorker, count: int = 12, seed: int = 0x57A7E) -> list[RequestState]:
    m = worker.model
    g = m.g
    states = []
    for i in range(count):
        ctx = _context_for(i, m.settings.context, 97)
        k1, k2 = hashing.stream_keys(seed, 1000 + i, hashing.DOMAIN_STATES)
        n = g.layers * 2 * g.kv_heads * ctx * g.head_dim
        idx = torch.arange(n, dtype=torch.int64)
        kv = (hashing.symmetric_unit(hashing.hash_elements(idx, k1, k2), torch) * 1.5).to(m.dtype)
        states.append(
            RequestState(
                name=f"synthetic-{i:02d}",
                source="synthetic",
                query_tokens=torch.tensor(_token_ids(seed, i, QUERY_BLOCK, g.vocab), dtype=torch.int64),
                context_length=ctx,
                kv=kv.view(g.layers, 2, g.kv_heads, ctx, g.head_dim),
                seed=_seed64(seed, i, hashing.DOMAIN_STATES),
                meta={"seed": seed},
            )
        )
    return states


def capture_states(worker: DraftWorker, count: int = 12, seed: int = 0xCA97) -> list[RequestState]:
    """Run the worker (eager, batch slot 0) and keep the states it produces."""
    m = worker.model
    g = m.g
    inp = worker.inputs
    cell_modes = (GREEDY, SAMPLED)
    states = []
    for i in range(count):
        ctx_target = _context_for(i, m.settings.context, 53)
        prompt_len = ctx_target - QUERY_BLOCK * CAPTURE_CALLS
        if prompt_len < 1:
            raise ValueError(f"--context {m.settings.context} is too short to capture states")
        ids = _token_ids(seed, 5000 + i, prompt_len + QUERY_BLOCK, g.vocab)
        run_prefill(worker, ids[:prompt_len])
        block = torch.tensor(ids[prompt_len:], dtype=torch.int64)
        ctx = prompt_len
        modes = []
        for c in range(CAPTURE_CALLS):
            mode = cell_modes[(i + c) % 2]
            cell = CellKey(1, 5, mode)
            out = CellOutputs.allocate(cell, m.device)
            inp.query_tokens[0].copy_(block)
            inp.context_lengths[0] = ctx
            inp.seeds[0] = _seed64(seed, 100 * i + c, hashing.DOMAIN_GUMBEL_ROW)
            worker.call(cell, out)
            block = out.proposals[0].to("cpu")  # every proposal accepted: the next query block
            ctx += QUERY_BLOCK
            modes.append(mode)
        kv = torch.cat([rank.read_kv(0, ctx) for rank in m.ranks], dim=2).to("cpu")
        states.append(
            RequestState(
                name=f"captured-{i:02d}",
                source="captured",
                query_tokens=block.clone(),
                context_length=ctx,
                kv=kv.contiguous(),
                seed=_seed64(seed, i, hashing.DOMAIN_STATES),
                meta={"seed": seed, "prompt_len": prompt_len, "calls": modes},
            )
        )
    return states


# ---------------------------------------------------------------------------- files
def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_states(states: list[RequestState], directory: str, model_fingerprint: str) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    entries, paths = [], []
    for s in states:
        fname = f"{s.name}.pt"
        path = os.path.join(directory, fname)
        torch.save(
            {
                "name": s.name,
                "source": s.source,
                "query_tokens": s.query_tokens,
                "context_length": s.context_length,
                "kv": s.kv,
                "seed": s.seed,
                "meta_json": json.dumps(s.meta, sort_keys=True),
            },
            path,
        )
        entries.append({"file": fname, "sha256": _file_sha256(path), "context_length": s.context_length})
        paths.append(path)
    manifest = {"format": STATE_FORMAT, "model_fingerprint": model_fingerprint, "states": entries}
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return paths


def load_states(directory: str, model_fingerprint: str) -> list[RequestState]:
    path = os.path.join(directory, "manifest.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--states {directory}: no manifest.json (make one with --capture-states)")
    with open(path) as f:
        manifest = json.load(f)
    if manifest.get("format") != STATE_FORMAT:
        raise ValueError(f"--states {directory}: format {manifest.get('format')!r}, expected {STATE_FORMAT!r}")
    if manifest["model_fingerprint"] != model_fingerprint:
        raise ValueError(
            f"--states {directory} were captured with another model (geometry, dtype, weights, backend "
            "or --context differ); capture them again with --capture-states"
        )
    states = []
    for e in manifest["states"]:
        fpath = os.path.join(directory, e["file"])
        if _file_sha256(fpath) != e["sha256"]:
            raise ValueError(f"--states {directory}: {e['file']} does not match its sha256 in manifest.json")
        d = torch.load(fpath, map_location="cpu", weights_only=True)
        states.append(
            RequestState(
                name=d["name"],
                source=d["source"],
                query_tokens=d["query_tokens"],
                context_length=int(d["context_length"]),
                kv=d["kv"],
                seed=int(d["seed"]),
                meta=json.loads(d["meta_json"]),
            )
        )
    return states


def states_digest(states: list[RequestState]) -> str:
    h = hashlib.sha256()
    for s in states:
        h.update(f"{s.name}|{s.context_length}|{s.seed}|".encode())
        h.update(hashing.tensor_bytes(s.query_tokens))
        h.update(hashing.tensor_bytes(s.kv))
    return h.hexdigest()
