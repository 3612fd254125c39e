"""The Python examples of mlx-lm's README, and the checks both backends' tests run.

Each example is mlx-lm's code as its README shows it (generate, stream_generate with the
chat template, and a sampler plus logits processors as its "Sampling" section describes),
with four substitutions: the import line (the one change a user makes), the model (the
embedded default model's directory instead of a Hub repo), ``backend=`` on ``load`` (so
one machine tests both backends) and ``max_tokens`` (kept short so the tests stay quick).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

GENERATE = """
from mlx_lm import load, generate

model, tokenizer = load("mlx-community/Mistral-7B-Instruct-v0.3-4bit")

prompt = "Write a story about Einstein"

messages = [{"role": "user", "content": prompt}]
prompt = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True,
)

text = generate(model, tokenizer, prompt=prompt, verbose=True)
"""

STREAM = """
from mlx_lm import load, stream_generate

repo = "mlx-community/Mistral-7B-Instruct-v0.3-4bit"
model, tokenizer = load(repo)

prompt = "Write a story about Einstein"

messages = [{"role": "user", "content": prompt}]
prompt = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True,
)

for response in stream_generate(model, tokenizer, prompt, max_tokens=512):
    print(response.text, end="", flush=True)
print()
"""

SAMPLING = """
from mlx_lm import load, generate
from mlx_lm.sample_utils import make_sampler, make_logits_processors

model, tokenizer = load("mlx-community/Mistral-7B-Instruct-v0.3-4bit")
sampler = make_sampler(temp=0.8, top_p=0.9, min_p=0.05, top_k=40)
logits_processors = make_logits_processors(repetition_penalty=1.1)
messages = [{"role": "user", "content": "Write a story about Einstein"}]
prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
text = generate(model, tokenizer, prompt=prompt, sampler=sampler,
                logits_processors=logits_processors, seed=7)
"""

EXAMPLES = {"generate": GENERATE, "stream": STREAM, "sampling": SAMPLING}


def adapt(code: str, model_dir: Path, backend: str, dtype: str, max_tokens: int) -> str:
    """mlx-lm's example with the substitutions named in this module's docstring."""
    code = code.replace("from mlx_lm", "from draftwise.mlx_lm")
    code = code.replace('"mlx-community/Mistral-7B-Instruct-v0.3-4bit"', repr(str(model_dir)))
    code = re.sub(
        r"load\((\w+|'[^']*')\)", rf"load(\1, backend={backend!r}, dtype={dtype!r})", code
    )
    code = code.replace("max_tokens=512", f"max_tokens={max_tokens}")
    code = re.sub(
        r"generate\(model, tokenizer, prompt=prompt,",
        f"generate(model, tokenizer, prompt=prompt, max_tokens={max_tokens},",
        code,
    )
    return code


def run_example(
    name: str, model_dir: Path, backend: str, dtype: str, max_tokens: int
) -> dict[str, Any]:
    """Run one example; its globals afterwards (``model``, ``tokenizer``, ``prompt``, ...)."""
    code = adapt(EXAMPLES[name], model_dir, backend, dtype, max_tokens)
    assert "mlx_lm import" not in code.replace("draftwise.mlx_lm import", "")
    scope: dict[str, Any] = {"__name__": f"readme_{name}"}
    exec(compile(code, f"<mlx-lm README: {name}>", "exec"), scope)
    return scope


def own_api_text(model: Any, prompt_ids: list[int], max_tokens: int, **options: Any) -> str:
    """What draftwise's own API writes for the same prompt ids and settings."""
    import draftwise

    return draftwise.generate(model, prompt_ids, max_tokens=max_tokens, **options)


def check_examples(model_dir: Path, backend: str, dtype: str, max_tokens: int, capsys: Any) -> None:
    """Every example runs, prints like mlx-lm, and writes draftwise's own API's text."""
    g = run_example("generate", model_dir, backend, dtype, max_tokens)
    out = capsys.readouterr().out
    assert isinstance(g["prompt"], list) and all(isinstance(t, int) for t in g["prompt"])
    assert g["text"] and out.startswith("=" * 10 + "\n" + g["text"])
    assert "Prompt: " in out and "Generation: " in out and "Peak memory: " in out
    assert g["text"] == own_api_text(g["model"], g["prompt"], max_tokens)
    # the default chat template, applied by draftwise's own API to a plain string
    assert g["text"] == own_api_text(g["model"], "Write a story about Einstein", max_tokens)

    s = run_example("stream", model_dir, backend, dtype, max_tokens)
    out = capsys.readouterr().out
    assert out == g["text"] + "\n"  # same prompt, greedy: the same text
    assert s["response"].finish_reason in ("stop", "length")

    sm = run_example("sampling", model_dir, backend, dtype, max_tokens)
    own = own_api_text(
        sm["model"],
        sm["prompt"],
        max_tokens,
        temp=0.8,
        top_p=0.9,
        min_p=0.05,
        top_k=40,
        repetition_penalty=1.1,
        repetition_context=20,
        seed=7,
    )
    assert sm["text"] == own and sm["text"]
