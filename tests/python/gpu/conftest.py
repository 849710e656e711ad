"""The GPU set (scripts/gpu-python.sh): torch op vs the C++ CUDA backend,
torch.compile, CUDA-graph capture, the transformers adapter. Every test is
marked `gpu`; modules skip themselves without torch / CUDA / transformers,
so `pytest tests/python/gpu` is clean on any machine."""
import os
import pathlib

import pytest


def pytest_collection_modifyitems(config, items):
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def report_dir():
    """Where timing reports go ($DSMLA_REPORT_DIR, else none)."""
    d = os.environ.get("DSMLA_REPORT_DIR")
    if d:
        pathlib.Path(d).mkdir(parents=True, exist_ok=True)
    return d
