"""mlx-lm's Python API on draftwise: switch by changing one import.

    # from mlx_lm import load, generate
    from draftwise.mlx_lm import load, generate

    model, tokenizer = load()             # or a local HF directory / .gguf file
    messages = [{"role": "user", "content": "Write a story about Einstein"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    text = generate(model, tokenizer, prompt=prompt, verbose=True)

``load``, ``generate``, ``stream_generate``, ``sample_utils.make_sampler`` and
``sample_utils.make_logits_processors`` take mlx-lm's arguments; generation is
draftwise's lossless speculative decoding, so the text is what the model alone would
write. What differs is listed in the README ("Coming from mlx-lm").
"""

from __future__ import annotations

from draftwise.mlx_lm.generation import GenerationResponse, generate, stream_generate
from draftwise.mlx_lm.tokenizer_utils import TokenizerWrapper
from draftwise.mlx_lm.utils import load

__all__ = ["GenerationResponse", "TokenizerWrapper", "generate", "load", "stream_generate"]
