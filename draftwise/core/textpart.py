"""The text model inside a multimodal checkpoint (gemma3: Gemma 3 4B, 12B and 27B ship as
image-text models), read as the text-only model it contains.

The config's ``text_config`` becomes the config (``model_type`` gemma3_text, the top
level's ``tie_word_embeddings`` kept); weights under ``model.language_model.`` (as
transformers 5 saves them) or ``language_model.model.`` (as the Hub's files have them)
become ``model.``; the vision tower and the projector are dropped.

Example::

    >>> text_config({"model_type": "gemma3", "text_config": {"hidden_size": 8}})["model_type"]
    'gemma3_text'
    >>> text_weight_name("language_model.model.norm.weight"), text_weight_name("vision_tower.x")
    ('model.norm.weight', None)
"""

from __future__ import annotations

from typing import Any

MULTIMODAL = {"gemma3": "gemma3_text"}  # checkpoint type -> its text model's type
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."))
_DROP = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.", "multi_modal_projector.")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` itself, or for a multimodal checkpoint the config of its text model."""
    inner = MULTIMODAL.get(str(cfg.get("model_type")))
    if inner is None or not isinstance(cfg.get("text_config"), dict):
        return cfg
    out = dict(cfg["text_config"])
    out["model_type"] = inner
    if "tie_word_embeddings" in cfg:
        out["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    for key in ("_config_path", "quantization", "quantization_config"):
        if key in cfg:
            out[key] = cfg[key]
    return out


def text_weight_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name as the text model's (None: not part of it)."""
    if name.startswith(_DROP):
        return None
    for old, new in _PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return name
