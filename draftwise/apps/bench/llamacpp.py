"""llama.cpp as a bench peer, through llama-cpp-python, on the model's own GGUF file.

- ``llama.cpp``: plain greedy decoding (``Llama.generate`` with ``temp=0``).
- ``llama.cpp-pld``: the same with its prompt-lookup draft (``LlamaPromptLookupDecoding``).

Both run on the GGUF the draftwise model was converted from (the embedded default model's
``SmolLM2-135M-Instruct.Q4_1.gguf``, or the ``--model`` file), with as many threads as
the draftwise backend. llama.cpp computes with the quantised weights, draftwise with the
dequantised ones, so outputs may differ: the bench marks them, and a generation that
raises is recorded with ``finish_reason="error: ..."`` and the tokens it had, not hidden.
``bash scripts/setup.sh --llama-cpp`` installs llama-cpp-python (it compiles llama.cpp).

Example::

    >>> peer = LlamaCppPeer("llama.cpp", gguf, eos_ids=[2], threads=2)  # doctest: +SKIP
    >>> peer.generate([1, 2, 3], max_tokens=8).tokens <= 8  # doctest: +SKIP
    True
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftwise.apps.bench.records import PEER, TurnResult
from draftwise.errors import DraftwiseError

LLAMA_CPP_PEERS = ("llama.cpp", "llama.cpp-pld")
PLD_TOKENS = 10  # draft tokens per lookup, as for the transformers peer
N_CTX = 4096  # prompt + answer of a multi-turn bench item fit
INSTALL_HINT = "bash scripts/setup.sh --llama-cpp"


class LlamaCppPeer:
    """llama-cpp-python ``Llama`` on one GGUF file, greedy, with or without prompt lookup."""

    kind = PEER

    def __init__(
        self, name: str, gguf: Path, eos_ids: Sequence[int], threads: int, llm: Any = None
    ) -> None:
        if name not in LLAMA_CPP_PEERS:
            raise DraftwiseError(f"unknown llama.cpp peer {name!r} (use {', '.join(LLAMA_CPP_PEERS)})")
        if threads < 1:
            raise DraftwiseError(f"llama.cpp threads must be >= 1, got {threads}")
        self.name = name
        self.eos_ids = frozenset(eos_ids)
        self.llm = llm if llm is not None else load_llama(gguf, threads, pld=name.endswith("-pld"))

    def reset_state(self) -> None:
        pass  # a peer learns nothing across prompts

    def generate(self, ids: list[int], max_tokens: int) -> TurnResult:
        self.llm.reset()  # a full prefill every turn, like our methods
        tokens: list[int] = []
        first: float | None = None
        reason: str | None = "length"
        t0 = time.perf_counter()
        try:
            gen = self.llm.generate(
                ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
            )
            for tok in gen:
                if first is None:
                    first = time.perf_counter()
                tokens.append(int(tok))
                if int(tok) in self.eos_ids:
                    reason = "stop"
                    break
                if len(tokens) >= max_tokens:
                    break
        except Exception as exc:  # reported in the results, not hidden
            reason = f"error: {type(exc).__name__}: {exc}"
            print(f"draftwise bench: peer {self.name} failed: {exc}", file=sys.stderr)
        wall = time.perf_counter() - t0
        return TurnResult(
            token_ids=tokens,
            wall_s=wall,
            prefill_s=(first if first is not None else t0 + wall) - t0,
            finish_reason=reason,
        )


def load_llama(gguf: Path, threads: int, pld: bool) -> Any:
    """A llama-cpp-python model on ``gguf`` (ImportError when it is not installed)."""
    from llama_cpp import Llama

    extra: dict[str, Any] = {}
    if pld:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        extra["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=PLD_TOKENS)
        # verifying a draft writes one row of scores per drafted token: without
        # logits_all the score buffer has no rows and generate() raises (0.3.x)
        extra["logits_all"] = True
    return Llama(
        model_path=str(gguf), n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads,
        seed=0, verbose=False, **extra,
    )


def find_gguf(model_arg: str | None, model_dir: Path) -> tuple[Path | None, str]:
    """The GGUF file behind the bench's model, or (None, why there is none).

    Example::

        >>> find_gguf("/m/x.gguf", Path("/cache/x"))
        (PosixPath('/m/x.gguf'), '')
        >>> find_gguf("/m/hf_dir", Path("/m/hf_dir"))[1]
        "model '/m/hf_dir' is not a GGUF file: llama.cpp needs one"
    """
    from draftwise.models.default import DEFAULT_MODEL_NAME, default_gguf_path

    if model_arg is not None and model_arg.lower().endswith(".gguf"):
        return Path(model_arg).expanduser(), ""
    if model_arg is None and model_dir.name == DEFAULT_MODEL_NAME:
        try:
            return default_gguf_path(), ""
        except DraftwiseError as exc:
            return None, str(exc)
    return None, f"model '{model_arg}' is not a GGUF file: llama.cpp needs one"
