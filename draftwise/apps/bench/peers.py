"""Other libraries on the same weights, prompts and stop tokens, for an outside reference.

- ``hf``: transformers ``AutoModelForCausalLM`` + ``generate(do_sample=False)``.
- ``hf-pld``: the same with prompt lookup decoding (``prompt_lookup_num_tokens=10``).
- ``mlx-lm``: ``mlx_lm.stream_generate`` with its default greedy sampler.
- ``llama.cpp``, ``llama.cpp-pld``: llama-cpp-python on the model's GGUF file, plain and
  with its prompt-lookup draft (``llamacpp.py``).

Every peer takes the chat-templated prompt ids the bench built, generates at most
``max_tokens`` tokens and stops after one of our eos ids (which it emits, as we do). A peer
whose library is missing is skipped with the reason rather than dropped silently.

Example::

    >>> peers, skipped = make_peers(["hf"], model_dir, eos_ids=[2])  # doctest: +SKIP
    >>> peers[0].generate([1, 2, 3], max_tokens=8).tokens <= 8  # doctest: +SKIP
    True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftwise.apps.bench.llamacpp import INSTALL_HINT, LLAMA_CPP_PEERS, LlamaCppPeer
from draftwise.apps.bench.records import PEER, TurnResult
from draftwise.errors import DraftwiseError
from draftwise.models.resolve import read_config

PEER_NAMES = ("hf", "hf-pld", "mlx-lm", *LLAMA_CPP_PEERS)
PLD_TOKENS = 10  # transformers' prompt_lookup_num_tokens
_TORCH_DTYPES = ("float32", "bfloat16", "float16")


def check_peer_names(names: Sequence[str]) -> None:
    """Raise DraftwiseError for a name not in PEER_NAMES."""
    for n in names:
        if n not in PEER_NAMES:
            raise DraftwiseError(
                f"unknown peer {n!r} in --peers (choose from: {', '.join(PEER_NAMES)})"
            )


class _FirstTokenClock:
    """A transformers streamer that notes when the first new token arrives.

    ``generate`` calls ``put`` once with the prompt, then with each new token.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


class HFPeer:
    """transformers ``generate``, greedy, with or without prompt lookup decoding."""

    kind = PEER

    def __init__(self, name: str, model: Any, eos_ids: Sequence[int], pld: bool) -> None:
        self.name = name
        self.model = model
        self.eos_ids = list(eos_ids)
        self.extra: dict[str, Any] = {"prompt_lookup_num_tokens": PLD_TOKENS} if pld else {}

    def reset_state(self) -> None:
        pass  # a peer learns nothing across prompts

    def generate(self, ids: list[int], max_tokens: int) -> TurnResult:
        import torch

        device = self.model.device
        sync: Callable[[], None] = (
            torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        )
        x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
        clock = _FirstTokenClock()
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=max_tokens,
                eos_token_id=self.eos_ids,
                pad_token_id=self.eos_ids[0],
                streamer=clock,
                temperature=None,
                top_p=None,
                top_k=None,
                **self.extra,
            )
        sync()
        wall = time.perf_counter() - t0
        new = [int(t) for t in out[0, len(ids) :].tolist()]
        stop = next((i + 1 for i, t in enumerate(new) if t in self.eos_ids), None)
        first = clock.first if clock.first is not None else t0 + wall
        return TurnResult(
            token_ids=new[:stop],
            wall_s=wall,
            prefill_s=first - t0,
            finish_reason="length" if stop is None else "stop",
        )


class MLXPeer:
    """``mlx_lm.stream_generate`` with greedy sampling on the same HF directory."""

    kind = PEER
    name = "mlx-lm"

    def __init__(self, model_dir: Path, eos_ids: Sequence[int]) -> None:
        from mlx_lm import load

        loaded = load(str(model_dir), model_config=mlx_config_fixes(model_dir))
        self.model, self.tokenizer = loaded[0], loaded[1]
        self.tokenizer.eos_token_ids = set(eos_ids)  # stop where we stop

    def reset_state(self) -> None:
        pass  # a peer learns nothing across prompts

    def generate(self, ids: list[int], max_tokens: int) -> TurnResult:
        from mlx_lm import stream_generate

        t0 = time.perf_counter()
        first: float | None = None
        tokens: list[int] = []
        reason = None
        for r in stream_generate(self.model, self.tokenizer, prompt=ids, max_tokens=max_tokens):
            if first is None:
                first = time.perf_counter()
            tokens.append(int(r.token))  # the last response repeats no token: see mlx_lm
            reason = r.finish_reason
        wall = time.perf_counter() - t0
        return TurnResult(
            token_ids=tokens,
            wall_s=wall,
            prefill_s=(first or t0 + wall) - t0,
            finish_reason=reason,
        )


def mlx_config_fixes(model_dir: Path) -> dict[str, Any]:
    """Config keys mlx-lm needs but cannot read from a transformers-5 ``config.json``.

    transformers 5 saves ``rope_parameters: {rope_theta, rope_type, ...}``; mlx-lm 0.32 reads
    only the old top-level ``rope_theta`` / ``rope_scaling`` and silently falls back to a
    theta of 10000, which changes the model (SmolLM2 uses 100000).

    Example::

        >>> import json, tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text(json.dumps(
        ...     {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}))
        >>> mlx_config_fixes(d)
        {'rope_theta': 100000.0}
    """
    config = read_config(model_dir)
    rope = config.get("rope_parameters")
    fixes: dict[str, Any] = {}
    if isinstance(rope, dict):
        if "rope_theta" not in config and "rope_theta" in rope:
            fixes["rope_theta"] = rope["rope_theta"]
        if config.get("rope_scaling") is None and rope.get("rope_type", "default") != "default":
            fixes["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return fixes


def _load_hf(model_dir: Path, device: str, dtype: str | None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    name = dtype if dtype in _TORCH_DTYPES else "float32"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, name))
    return model.to(device).eval()  # type: ignore[arg-type]  # stubs want a model


def make_peers(
    names: Sequence[str],
    model_dir: Path,
    eos_ids: Sequence[int],
    device: str = "cpu",
    dtype: str | None = None,
    gguf: Path | None = None,
    threads: int = 1,
    no_gguf: str = "no GGUF file for this model",
) -> tuple[list[HFPeer | MLXPeer | LlamaCppPeer], dict[str, str]]:
    """Load the named peers; returns (peers, {skipped name: reason}).

    ``device`` (cpu or cuda) and ``dtype`` (a torch dtype name; others give float32) apply
    to the transformers peers, which share one loaded model. The llama.cpp peers run
    ``gguf`` with ``threads`` threads (skipped with ``no_gguf`` when it is None).
    """
    check_peer_names(names)
    peers: list[HFPeer | MLXPeer | LlamaCppPeer] = []
    skipped: dict[str, str] = {}
    hf_model: Any = None
    for name in names:
        try:
            if name in ("hf", "hf-pld"):
                if hf_model is None:
                    hf_model = _load_hf(model_dir, device, dtype)
                peers.append(HFPeer(name, hf_model, eos_ids, pld=name == "hf-pld"))
            elif name in LLAMA_CPP_PEERS:
                if gguf is None:
                    skipped[name] = no_gguf
                    continue
                peers.append(LlamaCppPeer(name, gguf, eos_ids, threads))
            else:
                peers.append(MLXPeer(model_dir, eos_ids))
        except ImportError as exc:
            hint = f"; install it with `{INSTALL_HINT}`" if name in LLAMA_CPP_PEERS else ""
            skipped[name] = f"not installed ({exc}){hint}"
        except (ValueError, RuntimeError) as exc:  # llama-cpp-python could not load the file
            skipped[name] = f"failed to load: {exc}"
    return peers, skipped
