"""Tensor parallelism's processes: one per rank, started by sv itself or by torchrun.

`start_leader` is rank 0's side: it checks the size against the model (before any process
starts), starts ranks 1..N-1 as spawned processes (`run_worker`), joins them in one process
group, and loads rank 0's slice of the model under a `LeaderRunner` (rank_steps.py). Launched
by `torchrun` instead (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment: several
nodes, or processes started some other way), rank 0 starts nothing and every other rank runs
`serve_torchrun_rank` in place of its app.

Backends: NCCL between GPUs (one per rank: cuda:LOCAL_RANK), gloo on the CPU; the control
group (commands and step inputs from rank 0) is always gloo. NVLink multicast (NVLS) stays
off: NCCL_NVLS_ENABLE=0 is set for every rank.

A rank that dies ends the others. On rank 0 a watchdog thread waits on the rank processes;
when one ends unasked it terminates the rest, and the next call of the runner raises an
EngineError naming the rank and how it ended. A call already waiting in a collective ends
sooner by itself on the CPU (gloo sees the closed socket), or at the model group's timeout;
one still waiting `HANG_GRACE_S` after the death ends the process with that message. Each
other rank exits as soon as rank 0's process is gone (a thread watches its parent).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from sv_model.parallel import TensorParallel, check_tensor_parallel_size

from sv_engine.errors import EngineError
from sv_engine.loading import (
    EngineConfig,
    LoadedModel,
    TokenizerCheck,
    load_model,
    load_runner,
    model_config,
    resolve_device,
)
from sv_engine.rank_steps import LeaderRunner, serve_steps

# The model group's timeout: a collective waiting longer than this fails. It bounds the
# longest step (a long prefill, a first warm-up's compiles on one rank while another waits).
MODEL_GROUP_TIMEOUT = timedelta(minutes=5)
# The control group's: ranks 1..N-1 wait there for the next step as long as no request comes.
CONTROL_GROUP_TIMEOUT = timedelta(days=7)
# How long rank 0 may stay inside a collective after a rank has died before it exits.
HANG_GRACE_S = 30.0
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """How a started rank's process joins the others (pickled on its stdin)."""

    rank: int
    world_size: int
    init_method: str
    device: str  # this rank's device: cpu, or cuda:<rank>
    parent_pid: int  # rank 0's process: the rank exits when it is gone


def check_size(cfg: EngineConfig, model_dir: Path) -> None:
    """An EngineError unless cfg.tensor_parallel_size can run this model on this machine."""
    size = cfg.tensor_parallel_size
    if size < 1:
        raise EngineError(f"--tensor-parallel-size must be at least 1, got {size}")
    try:
        check_tensor_parallel_size(model_config(model_dir), size)
    except ValueError as e:
        raise EngineError(f"{e} ({model_dir / 'config.json'})") from e
    device = resolve_device(cfg.device)
    if device.type == "cuda" and size > torch.cuda.device_count() and torchrun_rank() is None:
        raise EngineError(
            f"--tensor-parallel-size {size} needs {size} GPUs, one per rank; torch sees "
            f"{torch.cuda.device_count()}"
        )


def torchrun_rank() -> int | None:
    """This process's rank when torchrun (or the like) launched it, else None."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return None
    return int(os.environ["RANK"])


def start_leader(
    model_dir: Path, cfg: EngineConfig, check_tokenizer: TokenizerCheck | None = None
) -> LoadedModel:
    """Rank 0: start the other ranks (unless torchrun did), join them, load its slice
    (`check_tokenizer`: as load_model's)."""
    check_size(cfg, model_dir)
    size = cfg.tensor_parallel_size
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # before any rank starts: spawned ones inherit it
    launched = torchrun_rank() is not None
    if launched and int(os.environ["WORLD_SIZE"]) != size:
        raise EngineError(
            f"--tensor-parallel-size {size} but torchrun started {os.environ['WORLD_SIZE']} "
            "processes (WORLD_SIZE): they must be equal"
        )
    init_method = "env://" if launched else f"tcp://127.0.0.1:{_free_port()}"
    watch = RankWatch([] if launched else _spawn(cfg, size, init_method))
    device = _rank_device(cfg, 0)

    def make_runner(*args: object, **kwargs: object) -> LeaderRunner:
        runner = LeaderRunner(*args, rank_failure=watch.failure, on_close=watch.stop, **kwargs)
        watch.leader = runner
        runner.rank_pids = [process.pid for process in watch.processes]
        atexit.register(_close_at_exit, weakref.ref(runner))  # the app's exit stops the ranks
        return runner

    try:
        tp = join_group(0, size, init_method, device)
        tp.broadcast((str(model_dir), cfg))  # what the other ranks load (see _serve)
        return load_model(
            model_dir,
            dataclasses.replace(cfg, device=str(device)),
            tp,
            make_runner,
            check_tokenizer,
        )
    except dist.DistError as e:
        watch.stop()
        raise EngineError(
            f"tensor parallelism: {watch.failure() or 'joining the ranks failed'} ({e})"
        ) from e
    except KeyboardInterrupt:
        watch.stop(at_once=True)  # the ranks, which ignore Ctrl-C, wait on a load it left
        raise
    except BaseException:
        watch.stop()
        raise


def _close_at_exit(runner: weakref.ref[LeaderRunner]) -> None:
    """Stop the ranks of a runner still open at exit (a weak reference: a closed runner's
    weights and KV pool are freed when its engine goes)."""
    alive = runner()
    if alive is not None:
        alive.close()


def join_group(rank: int, size: int, init_method: str, device: torch.device) -> TensorParallel:
    """Join the model group (NCCL on CUDA, gloo on the CPU) and the control group (gloo)."""
    if dist.is_initialized():
        raise EngineError("this process already belongs to a torch.distributed process group")
    cuda = device.type == "cuda"
    if cuda:
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=size,
        timeout=MODEL_GROUP_TIMEOUT,
        device_id=device if cuda else None,
    )
    control = dist.new_group(backend="gloo", timeout=CONTROL_GROUP_TIMEOUT)
    world = dist.group.WORLD
    if world is None:
        raise EngineError("torch.distributed has no default process group after joining one")
    return TensorParallel(rank, size, world, control)


class RankWatch:
    """Rank 0's watchdog over the rank processes it started (see the module doc)."""

    def __init__(self, processes: list[subprocess.Popen[bytes]]) -> None:
        self.processes = processes
        self.leader: LeaderRunner | None = None
        self._failure: str | None = None
        self._stopping = False
        self._ended = threading.Event()
        for rank, process in enumerate(processes, start=1):
            threading.Thread(
                target=self._wait, args=(rank, process), name=f"sv-rank-{rank}-watch", daemon=True
            ).start()
        if processes:
            threading.Thread(target=self._watch, name="sv-rank-watchdog", daemon=True).start()

    def failure(self) -> str | None:
        return self._failure

    def stop(self, *, at_once: bool = False) -> None:
        """End every rank process (asked: not a failure) and destroy the process groups (a
        runner's close then drops its hold on them: TensorParallel.leave). The processes get
        10 s each to end by themselves, unless `at_once`."""
        self._stopping = True
        for process in self.processes:
            if at_once:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.terminate()
                process.wait(timeout=10)
        if dist.is_initialized():
            dist.destroy_process_group()
        self._ended.set()  # the watchdog thread returns (it holds this watch and the runner)
        self.leader = None

    def _wait(self, rank: int, process: subprocess.Popen[bytes]) -> None:
        code = process.wait()
        if self._stopping or self._failure is not None:
            return
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code < 0
            else f"exited with code {code}"
        )
        self._failure = f"rank {rank} (pid {process.pid}) {how}; the other ranks were stopped"
        self._ended.set()

    def _watch(self) -> None:
        self._ended.wait()
        if self._stopping:
            return
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + HANG_GRACE_S
        while time.monotonic() < deadline:
            if self.leader is None or not self.leader.in_call:
                return  # rank 0 is not waiting on the dead rank: its next call raises
            time.sleep(0.1)
        print(f"sv: tensor parallelism: {self._failure}; exiting", file=sys.stderr, flush=True)
        os._exit(1)


def _spawn(cfg: EngineConfig, size: int, init_method: str) -> list[subprocess.Popen[bytes]]:
    """Ranks 1..size-1, each a fresh interpreter (no forked CUDA state, and no re-import of
    the caller's main module, as multiprocessing's spawn would do) reading its RankSpec."""
    processes = []
    for rank in range(1, size):
        device = str(_rank_device(cfg, rank))
        spec = RankSpec(rank, size, init_method, device, os.getpid())
        process = subprocess.Popen(
            [sys.executable, "-m", "sv_engine.rank_main"], stdin=subprocess.PIPE
        )
        if process.stdin is None:
            raise EngineError("a rank process started without a stdin pipe")
        process.stdin.write(pickle.dumps(spec))
        process.stdin.close()
        processes.append(process)
    return processes


def run_worker(spec: RankSpec) -> None:
    """A started rank's process: join, then serve rank 0's calls until it says stop."""
    _exit_with_parent(spec.parent_pid)
    # A terminal's Ctrl-C goes to the whole process group: rank 0 handles it and ends this
    # process (a KeyboardInterrupt here printed a traceback per rank).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    device = torch.device(spec.device)
    if device.type == "cpu":  # the ranks share the cores; rank 0 keeps torch's default
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world_size))
    try:
        _serve(join_group(spec.rank, spec.world_size, spec.init_method, device), device)
    except (EngineError, RuntimeError) as e:  # gloo's and NCCL's errors are RuntimeErrors
        print(f"sv: tensor-parallel rank {spec.rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def serve_torchrun_rank(device_name: str) -> None:
    """A rank other than 0 that torchrun launched (in place of its app): join, then serve
    rank 0's calls until it says stop. `device_name`: the app's --device."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = resolve_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    _serve(join_group(rank, size, "env://", device), device)


def _serve(tp: TensorParallel, device: torch.device) -> None:
    """Load this rank's slice of what rank 0 loads, then run its calls (rank_steps)."""
    try:
        sent = tp.broadcast()
        if not isinstance(sent, tuple):
            raise EngineError(f"rank {tp.rank}: expected (model folder, config) from rank 0")
        model_dir, cfg = Path(sent[0]), dataclasses.replace(sent[1], device=str(device))
        config = model_config(model_dir)
        max_model_len = cfg.max_model_len or config.max_position_embeddings  # as rank 0 checked
        serve_steps(load_runner(model_dir, cfg, config, max_model_len, tp), tp)
    finally:
        tp.leave()


def _rank_device(cfg: EngineConfig, rank: int) -> torch.device:
    """Rank `rank`'s device on this machine: cuda:<rank> (cuda:LOCAL_RANK under torchrun)."""
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        return device
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))


def _exit_with_parent(parent_pid: int) -> None:
    """End this process as soon as `parent_pid` is no longer its parent (rank 0 has died)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="sv-parent-watchdog", daemon=True).start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
