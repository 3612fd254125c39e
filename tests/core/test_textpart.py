"""``core/textpart.py``: a multimodal checkpoint read as its text model."""

from __future__ import annotations

from draftwise.core.textpart import text_config, text_weight_name


def test_the_text_config_is_taken_out_with_the_top_levels_tying():
    cfg = {"model_type": "gemma3", "tie_word_embeddings": True, "text_config": {"hidden_size": 8}}
    assert text_config(cfg) == {"hidden_size": 8, "model_type": "gemma3_text", "tie_word_embeddings": True}
    plain = {"model_type": "llama", "hidden_size": 8}
    assert text_config(plain) is plain  # anything else is returned as it is
    assert text_config({"model_type": "gemma3"}) == {"model_type": "gemma3"}  # no text_config


def test_both_naming_schemes_map_to_the_text_models_names_and_the_vision_parts_drop():
    assert text_weight_name("model.language_model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert text_weight_name("language_model.model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert text_weight_name("language_model.lm_head.weight") == "lm_head.weight"
    assert text_weight_name("lm_head.weight") == "lm_head.weight"
    for gone in ("vision_tower.encoder.x", "model.vision_tower.y", "multi_modal_projector.z",
                 "model.multi_modal_projector.mm_input_projection_weight"):
        assert text_weight_name(gone) is None
