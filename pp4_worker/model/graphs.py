"""Cell runners: one CUDA graph per cell, or the same call run eagerly.

A graph writes its own static CellOutputs.  A call is the upload of the request
inputs (one packed copy) and the replay of the graph: all D passes, both ranks,
head and merge.  By default the runner launches the copy just before the replay;
``upload_in_graph=True`` captures it as the graph's first node instead; H200 A/B
runs timed that 1.8-2.7% slower once and 0-2% faster once (docs/worker.md, revisions
4 and 5), so neither placement wins beyond run-to-run spread.  All
graphs share one memory pool: they only ever replay one at a time, so their
intermediates may reuse each other's memory.
"""
from __future__ import annotations

import torch

from pp4_worker.model.config import CellKey
from pp4_worker.model.draft import CellOutputs, DraftWorker


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

    def __init__(self, worker: DraftWorker, cell: CellKey, pool, upload_in_graph: bool = False):
        if worker.model.device.type != "cuda":
            raise RuntimeError("CUDA graphs need --device cuda")
        self.worker, self.cell = worker, cell
        self.upload_in_graph = upload_in_graph
        captured = worker.call if upload_in_graph else worker.compute
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
            captured(cell, self.outputs)
        torch.cuda.synchronize()

    def run(self) -> None:
        if not self.upload_in_graph:
            self.worker.upload()
        self.graph.replay()


def build_runners(worker: DraftWorker, cells: list[CellKey], graphs: bool,
                  upload_in_graph: bool = False) -> dict[CellKey, object]:
    if not graphs:
        return {cell: EagerRunner(worker, cell) for cell in cells}
    pool = torch.cuda.graph_pool_handle()
    return {cell: GraphRunner(worker, cell, pool, upload_in_graph) for cell in cells}
