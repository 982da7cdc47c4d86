"""Real multi-process torch.distributed runs on gloo, for tests: one process per rank on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_rank(rank: int, world: int, port: int, timeout_s: float = 60.0) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def _entry(rank: int, function: Callable, world: int, port: int, args: tuple) -> None:
    function(rank, world, port, *args)


def start_ranks(function: Callable, world: int, *args, port: int | None = None):
    """Start ``function(rank, world, port, *args)`` in ``world`` processes; returns the process context."""
    port = port or free_port()
    return mp.start_processes(
        _entry, args=(function, world, port, args), nprocs=world, join=False, start_method="spawn"
    )


def join(context, timeout_s: float = 120.0) -> None:
    """Wait for every rank; fail (killing the rest) when one fails or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            raise TimeoutError(f"ranks still running after {timeout_s} s")


def run_ranks(function: Callable, world: int, *args, timeout_s: float = 120.0) -> None:
    join(start_ranks(function, world, *args), timeout_s)
