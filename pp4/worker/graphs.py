"""Cell runners: one CUDA graph per cell, or the same call run eagerly.

A graph reads the worker's StaticInputs in place and writes its own static
CellOutputs; replay launches the whole call (all D passes, both ranks, head and
merge) with one host call.  All graphs share one memory pool: they only ever
replay one at a time, so their intermediates may reuse each other's memory.
"""
from __future__ import annotations

import torch

from pp4.worker.config import CellKey
from pp4.worker.draft import CellOutputs, DraftWorker


class EagerRunner:
    kind = "eager"

    def __init__(self, worker: DraftWorker, cell: CellKey):
        self.worker, self.cell = worker, cell
        self.outputs = CellOutputs.allocate(cell, worker.model.device)

    def run(self) -> None:
        self.worker.call(self.cell, self.outputs)


class GraphRunner:
    kind = "graph"
    WARMUP_CALLS = 2  # lazy cuBLAS/attention initialisation must happen outside capture

    def __init__(self, worker: DraftWorker, cell: CellKey, pool):
        if worker.model.device.type != "cuda":
            raise RuntimeError("CUDA graphs need --device cuda")
        self.worker, self.cell = worker, cell
        self.outputs = CellOutputs.allocate(cell, worker.model.device)
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP_CALLS):
                worker.call(cell, self.outputs)
        main.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            worker.call(cell, self.outputs)
        torch.cuda.synchronize()

    def run(self) -> None:
        self.graph.replay()


def build_runners(worker: DraftWorker, cells: list[CellKey], graphs: bool) -> dict[CellKey, object]:
    if not graphs:
        return {cell: EagerRunner(worker, cell) for cell in cells}
    pool = torch.cuda.graph_pool_handle()
    return {cell: GraphRunner(worker, cell, pool) for cell in cells}
