"""Prompts for tests: a few of our own (always there) and the shared benchmark files
(present in a dev checkout or CI, absent in a user's clone: tests using them skip)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

OWN_PROMPTS = [
    "Explain what a hash map is and give a short Python example that counts words.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the planets of the solar system in order, with one fact about each planet.",
]


def shared_dir() -> Path:
    env = os.environ.get("DRAFTWISE_SHARED")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared"


def bench_prompts(name: str = "specbench.jsonl") -> list[dict]:
    path = shared_dir() / "bench" / "prompts" / name
    if not path.is_file():
        pytest.skip(f"benchmark prompts not found at {path} (only in a dev checkout with ../shared)")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def one_per_category(rows: list[dict], categories: list[str]) -> list[dict]:
    out = []
    for cat in categories:
        out.append(next(r for r in rows if r["category"] == cat))
    return out
