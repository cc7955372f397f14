"""`TensorParallel.leave`: the process groups' worker threads end when a rank leaves, not at
the interpreter's exit (where a gloo thread releasing a finished collective's tensors aborts
the process). One rank over gloo, in this process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch.distributed as dist
from sv_model.parallel import TensorParallel

TASKS = Path("/proc/self/task")


def threads() -> int:
    return len(os.listdir(TASKS))


@pytest.mark.skipif(not TASKS.is_dir(), reason="counts this process's threads in /proc")
def test_leaving_ends_the_groups_threads_and_later_collectives_fail() -> None:
    if dist.is_initialized():
        pytest.skip("this process already belongs to a process group")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = threads()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    world = dist.group.WORLD
    assert world is not None
    tp = TensorParallel(0, 1, world, dist.new_group(backend="gloo"))
    del world
    assert tp.broadcast(("a command",)) == ("a command",)
    assert threads() > before  # gloo's worker and transport threads
    tp.leave()
    assert not dist.is_initialized()
    assert threads() == before
    with pytest.raises(RuntimeError, match="rank 0 has left its tensor-parallel process groups"):
        tp.broadcast(("another",))
    tp.leave()  # idempotent
