"""Shared fixtures: one real local Ray session for the whole suite."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray (2 CPUs, no dashboard) shared by every test that runs grids."""
    import ray

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()
