"""Shared fixtures of the Python tests: the `dsmla` command line tool (to
compare against) and case files it writes.

The CLI is $DSMLA_CLI, else build/dsmla of the repository (scripts/test.sh
builds it); tests that need it skip without it."""
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))  # safetensors_np


def _cli_path():
    given = os.environ.get("DSMLA_CLI")
    p = given or str(REPO / "build" / "dsmla")
    if given and not os.access(p, os.X_OK):
        # Named explicitly (scripts/test.sh does): a missing tool is an error, not a skip.
        pytest.fail(f"DSMLA_CLI={given} is not an executable", pytrace=False)
    return p if os.access(p, os.X_OK) else None


@pytest.fixture(scope="session")
def cli():
    p = _cli_path()
    if p is None:
        pytest.skip("the dsmla command line tool is not built (set DSMLA_CLI or build build/dsmla)")

    def run(*args, check=True):
        r = subprocess.run([p, *map(str, args)], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise AssertionError(f"dsmla {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
        return r

    return run


@pytest.fixture(scope="session")
def case_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cases")


@pytest.fixture(scope="session")
def make_case(cli, case_dir):
    """make_case(name, *make-case args) -> path of a case file (cached per name)."""
    made = {}

    def make(name, *args):
        if name not in made:
            path = case_dir / f"{name}.safetensors"
            cli("make-case", path, *args)
            made[name] = path
        return made[name]

    return make
