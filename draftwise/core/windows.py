"""Which layers of a model attend through a sliding window, read from its config.

gemma2 and gemma3 alternate sliding-window layers (a query at position p sees keys at
positions k with p - W < k <= p, as transformers masks them) with global ones; both
backends read the layout here, from the ``config.json`` dict.

Example::

    >>> sliding_layers({"model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 8})
    (8, (0, 2))
"""

from __future__ import annotations

from typing import Any

from draftwise.errors import DraftwiseError

WINDOWED_TYPES = ("gemma2", "gemma3_text")


def layer_types(cfg: dict[str, Any]) -> list[str]:
    """Each layer's type: the config's ``layer_types``, else transformers' defaults
    (gemma2 alternates from a sliding layer, gemma3 has one global layer in six)."""
    types = list(cfg.get("layer_types") or [])
    if types:
        return types
    n = int(cfg.get("num_hidden_layers") or 0)
    if cfg.get("model_type") not in WINDOWED_TYPES:
        return ["full_attention"] * n
    every = 2 if cfg.get("model_type") == "gemma2" else int(cfg.get("sliding_window_pattern") or 6)
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]


def sliding_layers(cfg: dict[str, Any]) -> tuple[int | None, tuple[int, ...]]:
    """(W, the sliding-window layers) of a gemma config; (None, ()) for the families whose
    windows draftwise serves by capping the context instead (mistral)."""
    if cfg.get("model_type") not in WINDOWED_TYPES:
        return None, ()
    types = layer_types(cfg)
    window = cfg.get("sliding_window")
    if window is None or "sliding_attention" not in types:
        return None, ()
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise DraftwiseError(f"config.json: sliding_window must be a positive integer, got {window!r}")
    return window, tuple(i for i, t in enumerate(types) if t == "sliding_attention")
