"""A one-rank gloo world for the tests of this directory that need torch.distributed initialised."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.distributed import free_port, init_rank


@pytest.fixture
def one_rank():
    init_rank(0, 1, free_port())
    try:
        yield
    finally:
        dist.destroy_process_group()
