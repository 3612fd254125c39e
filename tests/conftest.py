"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """HF-format directory of the embedded default model (converted once into the cache)."""
    from draftwise.models import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def torch_model(default_model_dir: Path):  # type: ignore[no-untyped-def]
    """The default model on the torch backend, float32 (loaded once per test session)."""
    pytest.importorskip("torch")
    import draftwise

    return draftwise.load(default_model_dir, backend="torch", dtype="float32")
