"""Test setup for sv-kernels.

Without a GPU the Triton kernels run under the Triton interpreter (TRITON_INTERPRET=1, set by
the repository's conftest.py before anything imports triton) on CPU tensors at small shapes
(sv_kernels.triton_ops then applies its two interpreter fixes, see triton_ops/_interpreter.py). With a GPU they run compiled,
and the `gpu`-marked tests add the serving shapes of Llama 3.2 1B.

Every test draws fresh random inputs: the `seed` fixture picks a new seed per test and prints it
(pytest shows it on failure); set SV_KERNELS_SEED=<n> to replay one.
"""

from __future__ import annotations

import os
import random
import sys

import pytest
import torch

# The shared helpers (kernels_testing.py) live beside this file; importlib mode needs the path.
sys.path.insert(0, os.path.dirname(__file__))

HAS_CUDA = torch.cuda.is_available()  # without it, the repository's conftest set TRITON_INTERPRET


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("SV_KERNELS_SEED", random.SystemRandom().randrange(2**31)))
    print(f"SV_KERNELS_SEED={value}")
    return value


@pytest.fixture
def gen(seed: int) -> torch.Generator:
    """A generator on the test device, seeded by `seed`."""
    return torch.Generator(device="cuda" if HAS_CUDA else "cpu").manual_seed(seed)
