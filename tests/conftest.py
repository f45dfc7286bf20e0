import os

import pytest
import torch
from support import random_model

if os.environ.get("MINISPEC_EXPECT_PACKAGE"):  # scripts/hand_mutants.py: the tests must import its changed copy
    import minispec

    assert os.path.dirname(minispec.__file__) == os.environ["MINISPEC_EXPECT_PACKAGE"], minispec.__file__
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n 2: one thread per worker, not two workers fighting for 2 cores
    torch.set_num_threads(1)


def pytest_configure(config):
    """With workers (-n auto), xdist's default "load" hands each worker a run of consecutive tests first: the slow ones
    sorted first below all went to one worker, which ran 1,072 s while the other finished in 662 s and waited (the
    whole suite, 2 workers on a 2-core machine, 2026-12-06). "worksteal" splits the tests the same way but lets an
    idle worker take half of another's queue: both ended at 866 s. An explicit ``--dist load`` is switched too."""
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(config, items):
    """The tests marked slow first, in their order, then the rest: with a worker per core (-n auto) a long test
    collected last (the lesson solutions are in tests/tools) ran alone for minutes after the other worker was done."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def pair():
    """A random target and a smaller random draft sharing a 64-token vocabulary."""
    return random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)


@pytest.fixture
def one_thread():
    """Two spinning threads on a shared 2-core machine make tensor code many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
