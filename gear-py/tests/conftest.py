"""Shared fixtures: unique shared-memory names, and a helper that runs a
Python child process with a deadline."""

import os
import subprocess
import sys
import uuid

import pytest


@pytest.fixture
def shm_name():
    """A fresh shared-memory table name; the file is removed afterwards if
    a test left it behind."""
    name = f"gear-py-test-{uuid.uuid4().hex[:12]}"
    yield name
    path = os.path.join("/dev/shm", name)
    if os.path.exists(path):
        os.unlink(path)


def run_child(code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (argv[1:] = args); fails the test
    if it does not finish within `timeout` seconds."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
