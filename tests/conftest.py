"""Shared fixtures: fixed seeds, random checkpoints of both families in the real on-disk format.

Without CUDA, Triton kernels run in its interpreter: ``TRITON_INTERPRET=1`` must be set before the first kernel
module is imported (``triton.jit`` reads it), so it is set here, when pytest starts, for every test file (the
kernel tests in tests/engine and the full decodes of tests/test_embedded.py alike)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite in one process per core (pytest-xdist): one intra-op thread each, for torch here and
    # for the subprocesses tests start (the CLI, the server), so that the workers do not spin against each other.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

from specfold.model.random_checkpoint import write_random_checkpoint


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """One intra-op thread for tests of tiny models on a shared 2-core box: more threads only spin against other
    jobs (measured: a sweep of 5 methods took 22.8 s with 2 threads, 1.1 s with one) and one thread also fixes the
    reduction order. Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fd_ckpt(tmp_path_factory: pytest.TempPathFactory):
    """Fast-dLLM-v2 family, odd shapes: hidden 96, 6 heads / 2 KV heads, vocab 301, q/k/v bias, untied head."""
    return write_random_checkpoint(
        tmp_path_factory.mktemp("fd"), "fast_dllm_v2", seed=1, mask_token_id=300, eos_token_id=299
    )


@pytest.fixture(scope="session")
def nld_ckpt(tmp_path_factory: pytest.TempPathFactory):
    """Nemotron-Labs-Diffusion family, odd shapes, YaRN + Llama-4 query scaling (original max 64 so it bites)."""
    return write_random_checkpoint(tmp_path_factory.mktemp("nld"), "nld", seed=2, mask_token_id=300, eos_token_id=299)
