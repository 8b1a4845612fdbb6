"""One complete draft-worker call, and the static tensors it reads and writes.

How depth works (a real autoregressive draft):

* pass 0 runs the query block -- the 5 tokens the target accepted since the last
  call, at positions ctx .. ctx+4 -- through every layer, writing their K/V into the
  cache; the head on the last position gives proposal 1;
* pass d (1 <= d < D) feeds proposal d back at position ctx+4+d as a single token,
  writes its K/V, and the head gives proposal d+1.

So a call of depth D reads every weight D times (the head's 1 GB cannot stay in a
60 MB L2 between dependent passes); the weight-read limit in the report counts
that.  KV slots from ctx on are the call's scratch: every call rewrites them before
reading them (causal mask), which is why replaying a call is idempotent.

Every input is a static tensor (the graph reads it in place), every output is
written in full on every call (so an output poisoned before a run proves the run
wrote it).
"""
from __future__ import annotations

import contextlib

import attrs
import torch

from pp4_worker.model.config import MAX_BATCH, QUERY_BLOCK, SAMPLED, SWITCH, CellKey
from pp4_worker.model.model import TensorParallelDraft


@attrs.define
class StaticInputs:
    """The request inputs of a call, as views of one packed byte buffer, so that one copy
    moves all of them between host and GPU."""

    packed: torch.Tensor  # uint8 [PACKED_BYTES]; the fields below are views of it
    query_tokens: torch.Tensor  # [MAX_BATCH, QUERY_BLOCK] int64
    context_lengths: torch.Tensor  # [MAX_BATCH] int64: tokens already in the KV cache
    seeds: torch.Tensor  # [MAX_BATCH] int64: per-row sampling seed of this call
    t1_mask: torch.Tensor  # [MAX_BATCH] bool: switch graphs only; True = sampled row

    # Byte offsets of the fields (int64 ones 8-aligned, the bool mask last).
    _TOKENS = 0
    _CONTEXT = _TOKENS + 8 * MAX_BATCH * QUERY_BLOCK
    _SEEDS = _CONTEXT + 8 * MAX_BATCH
    _MASK = _SEEDS + 8 * MAX_BATCH
    PACKED_BYTES = _MASK + MAX_BATCH

    @classmethod
    def allocate(cls, device: torch.device, pinned: bool = False) -> "StaticInputs":
        buf = torch.zeros(cls.PACKED_BYTES, dtype=torch.uint8, device=device)
        if pinned:
            buf = buf.pin_memory()

        def field(start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
            return buf[start:end].view(dtype)

        inputs = cls(
            packed=buf,
            query_tokens=field(cls._TOKENS, cls._CONTEXT, torch.int64).view(MAX_BATCH, QUERY_BLOCK),
            context_lengths=field(cls._CONTEXT, cls._SEEDS, torch.int64),
            seeds=field(cls._SEEDS, cls._MASK, torch.int64),
            t1_mask=field(cls._MASK, cls.PACKED_BYTES, torch.bool),
        )
        inputs.context_lengths.fill_(1)
        return inputs


@attrs.define
class CellOutputs:
    proposals: torch.Tensor  # [B, D] int64
    confidences: torch.Tensor  # [B, D] fp32: softmax probability of the chosen token
    q_payload: torch.Tensor  # [B, QUERY_BLOCK] fp32: draft prob of sampled tokens, 0 for T0, 0 beyond D

    @classmethod
    def allocate(cls, cell: CellKey, device: torch.device) -> "CellOutputs":
        return cls(
            proposals=torch.zeros(cell.batch, cell.depth, dtype=torch.int64, device=device),
            confidences=torch.zeros(cell.batch, cell.depth, dtype=torch.float32, device=device),
            q_payload=torch.zeros(cell.batch, QUERY_BLOCK, dtype=torch.float32, device=device),
        )

    def poison(self) -> None:
        """Values a correct call can never leave behind."""
        self.proposals.fill_(-7)
        self.confidences.fill_(float("nan"))
        self.q_payload.fill_(float("nan"))

    def to_host(self) -> "CellOutputs":
        return CellOutputs(*(t.detach().to("cpu", copy=True) for t in attrs.astuple(self, recurse=False)))


class DraftWorker:
    """The model plus its request inputs.

    Callers write a request into ``inputs`` (pinned host memory on CUDA); the model reads
    ``device_inputs``; ``upload`` copies the one into the other in a single copy.  ``call``
    is a whole call, upload included; ``compute`` is the same call without it, for a graph
    runner that uploads before the replay instead (graphs.py).  Nobody may write ``inputs``
    while a call that reads them is in flight: every user here synchronises after a call.
    """

    def __init__(self, model: TensorParallelDraft):
        self.model = model
        if model.device.type == "cuda":
            self.inputs = StaticInputs.allocate(torch.device("cpu"), pinned=True)
            self.device_inputs = StaticInputs.allocate(model.device)
        else:  # one memory: nothing to copy
            self.inputs = self.device_inputs = StaticInputs.allocate(model.device)

    def upload(self) -> None:
        if self.device_inputs is not self.inputs:
            self.device_inputs.packed.copy_(self.inputs.packed, non_blocking=True)

    def call(self, cell: CellKey, out: CellOutputs) -> None:
        self.upload()
        self.compute(cell, out)

    def compute(self, cell: CellKey, out: CellOutputs) -> None:
        m, inp = self.model, self.device_inputs
        B, D, mode = cell.batch, cell.depth, cell.mode
        T = QUERY_BLOCK
        positions = inp.context_lengths[:B, None] + m.offsets[: T + D - 1]  # [B, T + D - 1]
        plan = m.call_positions(positions)
        out.q_payload.zero_()
        t1 = inp.t1_mask[:B] if mode == SWITCH else None
        sampling_call = mode in (SAMPLED, SWITCH)
        if sampling_call:
            self._start_noise(B, D)
        tokens = inp.query_tokens[:B]
        for depth in range(D):
            p0, p1 = (0, T) if depth == 0 else (T + depth - 1, T + depth)
            normed = m.forward(tokens, plan.step(p0, p1))
            if depth == 0 and sampling_call:
                self._join_noise()
            stats = m.per_rank(lambda rank, n: rank.head_stats(m.backend.last_positions(n, B, p1 - p0), mode, depth, t1),
                               normed)
            m.backend.merge_choice(stats, out.proposals, out.confidences, out.q_payload, depth, mode, t1, m.zero_f32)
            tokens = out.proposals[:, depth : depth + 1]  # fed back: the next pass's input token

    # The noise depends only on the seeds, so it runs beside pass 0 on a second stream
    # (when CUDA) and joins before the first head reads it.
    def _start_noise(self, B: int, D: int) -> None:
        m = self.model
        stream = m.noise_stream
        ctx = contextlib.nullcontext()
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(m.device))
            ctx = torch.cuda.stream(stream)
        with ctx:
            for rank in m.ranks:
                rank.write_gumbel_noise(self.device_inputs.seeds[:B], m.row_depth[:D, :B])

    def _join_noise(self) -> None:
        stream = self.model.noise_stream
        if stream is not None:
            torch.cuda.current_stream(self.model.device).wait_stream(stream)

    # ---------------------------------------------------------------- state staging
    def load_request(self, slot: int, state) -> None:
        """Put one RequestState into batch slot ``slot`` (KV cache and inputs)."""
        m, inp = self.model, self.inputs
        if state.context_length + QUERY_BLOCK + 4 > m.cache_len:
            raise ValueError(
                f"state {state.name}: context {state.context_length} does not fit a KV cache of "
                f"{m.cache_len} slots; raise --context"
            )
        kv = state.kv.to(device=m.device, dtype=m.dtype)
        for rank in m.ranks:
            rank.load_kv(slot, kv, state.context_length)
        inp.query_tokens[slot].copy_(state.query_tokens)
        inp.context_lengths[slot] = state.context_length
        inp.seeds[slot] = state.seed

    def set_mask(self, mask: list[bool]) -> None:
        self.inputs.t1_mask[: len(mask)].copy_(torch.tensor(mask, dtype=torch.bool))


def run_prefill(worker: DraftWorker, tokens: list[int], chunk: int = 64) -> None:
    """Fill batch slot 0's KV cache with a prompt (positions 0..len-1) by the model itself.

    Same layer code as a call; only the chunk length differs.  Slot 0 because attention
    reads cache rows [0, B) and a prefill is a batch of one.
    """
    m = worker.model
    for rank in m.ranks:
        for cache in rank.kv:
            cache[:, 0].zero_()
    ids = torch.tensor(tokens, dtype=torch.int64, device=m.device)
    for a in range(0, len(tokens), chunk):
        b = min(len(tokens), a + chunk)
        positions = torch.arange(a, b, dtype=torch.int64, device=m.device)[None, :]
        m.forward(ids[None, a:b], m.call_positions(positions).step(0, b - a))
