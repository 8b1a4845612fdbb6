"""CLI argument errors, guards, timing statistics and a full CPU run of ``python -m pp4_worker``."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pp4_worker.harness import cli, guards
from pp4_worker.harness.cli import parse_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "python -m pp4_worker: error: "


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-sizes", "1,5"], "--batch-sizes: each batch size must be between 1 and 4, got 5"),
        (["--batch-sizes", "one"], "--batch-sizes: expected comma-separated integers, got 'one'"),
        (["--depths", "3,4"], "--depths: each depth must be 4 or 5, got 3"),
        (["--layers", "6"], "--layers must be between 1 and 5, got 6"),
        (["--gemm", "triton"], "--gemm triton needs --backend triton"),
        (["--attention", "fused"], "--attention fused needs --backend triton or exl3 (--backend torch has gemm and sdpa)"),
        (["--backend", "exl3", "--device", "cpu"], "--backend exl3 runs EXL3's CUDA kernels: it needs --device cuda"),
        (["--backend", "exl3", "--dtype", "bfloat16"], "--backend exl3 needs --dtype float16 (EXL3's kernels take fp16), got bfloat16"),
        (["--backend", "exl3", "--exl3-bits", "9"], "--exl3-bits must be between 2 and 8, got 9"),
        (["--backend", "exl3", "--exl3-head-bits", "1"], "--exl3-head-bits must be between 2 and 8, got 1"),
        (["--exl3-bits", "3"], "--exl3-bits needs --backend exl3 or exl3-decode"),
        (["--backend", "triton", "--exl3-module", "facc"], "--exl3-module needs --backend exl3 or exl3-decode"),
        (["--exl3-select", "autotune"], "--exl3-select needs --backend exl3 or exl3-decode"),
        (["--exl3-codebook", "mcg"], "--exl3-codebook needs --backend exl3 or exl3-decode"),
        (["--backend", "exl3", "--exl3-fuse", "off"],
         "--exl3-fuse needs --backend exl3-decode (the fused kernels are pp4's decode GEMM's)"),
        (["--backend", "exl3-decode", "--device", "cpu"],
         "--backend exl3-decode runs EXL3's CUDA kernels: it needs --device cuda"),
        (["--backend", "exl3", "--gemm", "triton"], "--gemm triton needs --backend triton"),
        (["--pdl", "on"], "--pdl on needs --backend triton or exl3 (the torch backend launches no Triton kernels)"),
        (["--backend", "triton", "--device", "cpu", "--pdl", "on"],
         "--pdl on needs --device cuda (programmatic dependent launch is a GPU launch attribute)"),
        (["--backend", "triton", "--device", "cpu", "--rank-streams", "on"],
         "--rank-streams on needs --device cuda (streams are CUDA's)"),
        (["--backend", "exl3", "--rank-streams", "on"],
         "--rank-streams on: --backend exl3's GEMM (upstream's) keeps one lock buffer per device, which two ranks "
         "at once would share; use --rank-streams off"),
        (["--layers", "0"], "--layers must be between 1 and 5, got 0"),
        (["--context", "8"], "--context must be at least 32, got 8"),
        (["--max-rss", "12X"], "--max-rss: not a size: '12X' (use a byte count or a number with K, M, G, T or P, e.g. 48G)"),
        (["--reference", "a.json", "--write-reference", "b.json"], "use either --reference or --write-reference, not both"),
        (["--calls", "0"], "--calls must be at least 1, got 0"),
        (["--vocab", "1001"], "geometry: vocab (1001) must split evenly over 2 ranks"),
        (["--heads", "30"], "geometry: heads (30) must be a multiple of kv_heads (8)"),
        (["--export-weights", "x", "--weights", "y"],
         "--export-weights writes the synthetic weights; it cannot be combined with --weights"),
    ],
)
def test_argument_errors_have_exact_messages(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == PREFIX + message


@pytest.mark.parametrize("argv, gemm, pdl, streams", [
    (["--backend", "torch"], "cublas", "off", "off"), (["--backend", "triton"], "triton", "on", "on"),
    (["--backend", "triton", "--device", "cpu"], "triton", "off", "off"), (["--backend", "exl3"], "cublas", "off", "off"),
    (["--backend", "exl3", "--pdl", "on"], "cublas", "on", "off"), (["--backend", "exl3-decode"], "cublas", "on", "on"),
    (["--backend", "exl3-decode", "--pdl", "off", "--rank-streams", "off"], "cublas", "off", "off")])
def test_the_triton_backend_defaults_to_the_skinny_gemm_pdl_and_rank_streams_on_cuda(argv, gemm, pdl, streams):
    args = cli.build_parser().parse_args(argv)
    cli.validate(args)
    assert (args.gemm, args.pdl, args.rank_streams) == (gemm, pdl, streams)


def test_argparse_rejects_unknown_choices(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--backend", "cutlass"])
    assert "invalid choice: 'cutlass'" in capsys.readouterr().err


def test_a_pair_of_ranks_without_two_gpus_is_a_clear_error(capsys):
    pytest.importorskip("torch")
    import torch

    found = torch.cuda.device_count()
    if found >= 2:
        pytest.skip("this machine has two GPUs: --ranks pair can run")
    rc = cli.main(["--device", "cpu", "--geometry", "tiny", "--context", "32", "--ranks", "pair"])
    assert rc == guards.EXIT_ENVIRONMENT
    assert (f"pp4_worker: --ranks pair needs 2 CUDA GPUs (one per rank, NCCL all-reduce); found {found}"
            in capsys.readouterr().err)


def test_cuda_requested_without_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert cli.main(["--geometry", "tiny"]) == guards.EXIT_ENVIRONMENT
    assert ("pp4_worker: --device cuda: no CUDA GPU is visible. On a CPU: --device cpu --geometry tiny "
            in capsys.readouterr().err)


def test_parse_size():
    assert parse_size("48G") == 48 * 2**30
    assert parse_size("1.5M") == int(1.5 * 2**20)
    assert parse_size("512") == 512
    assert parse_size("2GiB") == 2 * 2**30
    with pytest.raises(ValueError, match="not a size: '-1G'"):
        parse_size("-1G")


def test_private_caches(tmp_path, monkeypatch):
    for var in guards.CACHE_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    base, created = guards.setup_private_caches(str(tmp_path / "c"))
    assert not created
    for var, sub in guards.CACHE_VARIABLES.items():
        assert os.environ[var] == os.path.join(base, sub) and os.path.isdir(os.environ[var])
    assert oct(os.stat(base).st_mode & 0o777) == oct(0o700)


def test_gpu_lock_waits_then_fails_with_clear_message(tmp_path):
    first = guards.GpuLock(str(tmp_path), "GPU-test", 1.0).acquire()
    t0 = time.monotonic()
    with pytest.raises(guards.GuardError) as exc:
        guards.GpuLock(str(tmp_path), "GPU-test", 0.5).acquire()
    assert time.monotonic() - t0 >= 0.5
    msg = str(exc.value)
    assert msg.startswith(f"GPU GPU-test is locked by another run (pid {os.getpid()} on ")
    assert msg.endswith(f"waited 0.5 s for {tmp_path}/GPU-test.lock (raise --lock-timeout to wait longer)")
    first.release()
    with guards.GpuLock(str(tmp_path), "GPU-test", 0.5) as again:
        assert again.fd is not None
    with guards.GpuLock(str(tmp_path), "GPU-other", 0.0):  # another card is independent
        pass


def test_rss_guard_trips_and_interrupts_the_main_thread():
    g = guards.RssGuard(limit_bytes=1, interval_s=0.01, grace_s=60)
    with pytest.raises(guards.RssLimitExceeded) as exc:
        with g:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:
                time.sleep(0.05)
    assert g.tripped.is_set() and exc.value.exit_code == guards.EXIT_RSS
    assert "exceeds --max-rss 0.00 GiB; run stopped" in str(exc.value)


def test_rss_guard_tripping_before_a_with_body_leaves_no_hard_exit_armed():
    """The signal can land while start() (a with's __enter__) is still running, so that
    __exit__ never runs: the delivered exception must disarm the hard exit by itself, or
    the process dies grace_s later (this killed a CI run's pytest with exit code 3)."""
    before = signal.getsignal(signal.SIGUSR1)
    g = guards.RssGuard(limit_bytes=1, interval_s=0.01, grace_s=60)
    with pytest.raises(guards.RssLimitExceeded):
        g.start()  # no stop() ever follows, as when __enter__ is interrupted
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            time.sleep(0.05)
    g._thread.join(timeout=5)
    assert not g._thread.is_alive()  # returned instead of waiting 60 s to hard-exit
    assert signal.getsignal(signal.SIGUSR1) is before


def test_rss_guard_quiet_under_limit():
    with guards.RssGuard(limit_bytes=1 << 50, interval_s=0.01) as g:
        time.sleep(0.1)
    assert not g.tripped.is_set() and g.peak > 0


def test_cli_stops_cleanly_on_rss_limit():
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "pp4_worker", "--device", "cpu", "--geometry", "tiny",
                        "--context", "32", "--max-rss", "1M"], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=120)
    assert p.returncode == guards.EXIT_RSS, p.stderr
    assert "pp4_worker: resident memory" in p.stderr and "exceeds --max-rss 0.00 GiB; run stopped" in p.stderr
    assert "Traceback" not in p.stderr


def test_percentiles_and_stats():
    from pp4_worker.harness import timing

    vals = [float(v) for v in range(1, 11)]
    assert timing.percentile(vals, 50) == 5.5
    assert timing.percentile(vals, 20) == pytest.approx(2.8)
    t = timing.cell_stats("c", vals)
    assert t.median_ms == 5.5 and t.p80_ms == pytest.approx(8.2)
    assert t.iqr_over_median == pytest.approx((7.75 - 3.25) / 5.5)


def test_full_cpu_run_writes_json(tmp_path, capsys):
    pytest.importorskip("torch")
    js, ref, states_dir = tmp_path / "w.json", tmp_path / "ref.json", tmp_path / "states"
    common = ["--device", "cpu", "--geometry", "tiny", "--context", "32", "--batch-sizes", "2",
              "--depths", "4", "--calls", "2", "--repetitions", "2", "--warmup", "1", "--copy-bytes", "8M"]
    rc = cli.main(common + ["--capture-states", str(states_dir), "--write-reference", str(ref),
                            "--json", str(js), "--plot", str(tmp_path / "w.png")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "gate passed" in out and "B2-D4-switch" in out and "Outside the timing" in out
    doc = json.loads(js.read_text())
    assert doc["gate"]["ok"] and doc["states"] == {**doc["states"], "synthetic": 12, "captured": 12}
    assert len(doc["timing"]["cells"]) == 3 and doc["backend"] == "torch"
    assert all(len(v) == 4 for v in doc["timing"]["samples_ms"].values())
    assert doc["timing"]["cells"][0]["passes"] == 4
    assert (states_dir / "manifest.json").exists()
    # a second run loads the same states from the files and reproduces every digest
    rc = cli.main(common + ["--states", str(states_dir), "--reference", str(ref), "--gate-only"])
    out = capsys.readouterr().out
    assert rc == 0 and "all digests match" in out


def test_gate_failure_exits_nonzero_without_timing(tmp_path, capsys):
    pytest.importorskip("torch")
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"format": "pp4.worker.reference/1", "made_with": {}, "config_sha256": "x",
                               "cells": {}}))
    rc = cli.main(["--device", "cpu", "--geometry", "tiny", "--context", "32", "--batch-sizes", "1",
                   "--depths", "4", "--reference", str(ref), "--json", str(tmp_path / "w.json")])
    out = capsys.readouterr().out
    assert rc == guards.EXIT_GATE
    assert "GATE FAILED" in out and "another configuration" in out and "median ms" not in out
    assert "timing" not in json.loads((tmp_path / "w.json").read_text())
