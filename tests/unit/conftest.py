"""Unit-test set-up of the wheel tier: plans never read the developer's measured compile costs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_measured_costs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Measured costs (porter.wheels.costs) live in porter's cache; a unit test sees an empty one of its own."""
    root = tmp_path_factory.mktemp("costs-cache")
    monkeypatch.setattr("porter.wheels.costs.cache_dir", lambda: root)
    return root
