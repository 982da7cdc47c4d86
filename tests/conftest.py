"""What every test under tests/ gets: torch.distributed left as the test found it.

A test that initialises a one-rank group in this process (``tests.distributed.init_rank``) sets
``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; left behind, they make a later test's
Hugging Face Trainer or Accelerate start a process group of its own, and the next test that starts
one fails. So the variables are restored after each test, and a default process group still
initialised after a test is destroyed and fails that test by name.
"""

from __future__ import annotations

import os
import sys

import pytest

_DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def _distributed_left_as_found():
    before = {name: os.environ.get(name) for name in _DISTRIBUTED_ENV}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left torch.distributed's default process group initialised (destroyed now)")
