"""Tensor parallelism's failures on the CPU: sizes refused before any process starts, and a
rank killed mid-run (this process is rank 0 over gloo, the engine starts rank 1)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch
from sv_engine import Engine, EngineError, SamplingParams
from sv_engine.rank_steps import LeaderRunner


def open_engine(model_dir: Path, size: int) -> Engine:
    return Engine.from_model_dir(model_dir, device="cpu", kv_cache_mib=2, tensor_parallel_size=size)


def test_sizes_the_model_cannot_take_are_one_line_errors(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tiny_llama_dir
    with pytest.raises(EngineError, match="must be at least 1, got 0"):
        open_engine(d, 0)
    with pytest.raises(EngineError) as caught:
        open_engine(d, 3)
    message = str(caught.value)
    assert "\n" not in message
    assert "attention heads (4), key/value heads (2) and MLP width (256)" in message
    with pytest.raises(EngineError, match="does not divide the key/value heads"):
        open_engine(d, 4)
    # More ranks than GPUs: refused before any process starts (torch told there is one GPU).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(EngineError, match="needs 2 GPUs, one per rank; torch sees 1"):
        Engine.from_model_dir(d, device="cuda", tensor_parallel_size=2)


def test_a_rank_killed_mid_run_ends_the_run_with_an_error_naming_it(tiny_llama_dir: Path) -> None:
    engine = open_engine(tiny_llama_dir, 2)
    runner = engine.runner
    assert isinstance(runner, LeaderRunner)
    engine.add_request([9, 8, 7, 6, 5], SamplingParams(max_new_tokens=400, ignore_eos=True))
    for _ in range(3):
        engine.step()
    (pid,) = runner.rank_pids
    os.kill(pid, signal.SIGKILL)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            while engine.has_unfinished():
                engine.step()
        except BaseException as e:  # handed to the test's thread
            raised.append(e)

    stepping = threading.Thread(target=run, daemon=True)
    stepping.start()
    stepping.join(timeout=60)
    assert not stepping.is_alive(), "the engine hung after a rank died"
    assert len(raised) == 1 and isinstance(raised[0], EngineError)
    assert f"rank 1 (pid {pid}) was killed by SIGKILL" in str(raised[0])
    assert engine.stats.free_pages == engine.stats.pool_pages  # its request's pages came back
    with pytest.raises(EngineError, match=r"rank 1 .* was killed by SIGKILL"):
        engine.generate([[5, 6]], SamplingParams(max_new_tokens=2))
    runner.close()


RANK_ZERO_DIES = """
import os, signal, sys
from sv_engine import Engine
engine = Engine.from_model_dir(sys.argv[1], device="cpu", kv_cache_mib=2, tensor_parallel_size=2)
print(engine.runner.rank_pids[0], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_other_ranks_exit_when_rank_zero_dies(tiny_llama_dir: Path) -> None:
    import subprocess
    import sys
    import time

    done = subprocess.run(
        [sys.executable, "-c", RANK_ZERO_DIES, str(tiny_llama_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    assert not _alive(pid), f"rank 1 (pid {pid}) outlived rank 0"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its new parent) is gone for this purpose.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


CTRL_C_MID_CALL = """
import os, signal, sys, time
from sv_engine import Engine, SamplingParams
from sv_model.parallel import TensorParallel

engine = Engine.from_model_dir(sys.argv[1], device="cpu", kv_cache_mib=2, tensor_parallel_size=2)
(rank_1,) = engine.runner.rank_pids
print(rank_1, flush=True)
with open(f"/proc/{rank_1}/status") as status:  # the signals rank 1 ignores, as a bit mask
    ignored = int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
print("SIGINT ignored" if ignored >> (signal.SIGINT - 1) & 1 else "SIGINT taken", flush=True)
reduce = TensorParallel.all_reduce

def interrupted(self, x):  # Ctrl-C lands after the first all-reduce of a forward
    reduce(self, x)
    TensorParallel.all_reduce = reduce
    os.kill(rank_1, signal.SIGINT)  # a terminal sends it to the whole process group
    raise KeyboardInterrupt

TensorParallel.all_reduce = interrupted
try:
    engine.generate([[9, 8, 7, 6, 5]], SamplingParams(max_new_tokens=4))
except KeyboardInterrupt:
    print("interrupted", flush=True)
engine.cancel_all()
start = time.monotonic()
engine.runner.close()
print(f"closed in {time.monotonic() - start:.0f} s", flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_ctrl_c_inside_a_call_ends_the_ranks_without_a_hang(tiny_llama_dir: Path) -> None:
    """Rank 1 waits in the forward's next all-reduce that rank 0 will never make: closing
    used to ask it to stop over the control group and hang there until the model group's
    timeout (5 minutes). Rank 1 leaves Ctrl-C to rank 0 (it printed a traceback)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_MID_CALL, str(tiny_llama_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    pid, sigint, interrupted, closed = done.stdout.splitlines()
    assert sigint == "SIGINT ignored"
    assert interrupted == "interrupted"
    assert closed in {f"closed in {s} s" for s in range(11)}, closed
    assert not _alive(int(pid)), f"rank 1 (pid {pid}) outlived the close"
