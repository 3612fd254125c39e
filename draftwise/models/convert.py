"""One-time conversion of a GGUF file into a float32 Hugging Face model directory.

The result lives in ``cache_dir()/models/<name>/`` and holds ``config.json``,
``model.safetensors`` (float32; tied ``lm_head.weight`` left out),
``generation_config.json`` and the tokenizer files. It is written into a temporary
directory beside the target and renamed into place, under a file lock, so a crash never
leaves half a model and two processes never convert at once. Later calls only check that
the directory exists (no torch or transformers import).

Example::

    >>> from draftwise.models.convert import convert_gguf
    >>> model_dir = convert_gguf(Path("my-model.Q4_K_M.gguf"))  # doctest: +SKIP
    >>> sorted(p.name for p in model_dir.iterdir())  # doctest: +SKIP
    ['chat_template.jinja', 'config.json', 'generation_config.json', 'model.safetensors', ...]
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.models.paths import models_dir

try:  # POSIX only; without it conversions are still atomic, just not serialised.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

Progress = Callable[[str], None]

#: Files every converted directory holds (``model.safetensors`` is written last).
CONVERTED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "model.safetensors")


def print_progress(message: str) -> None:
    """Default progress callback: print ``message`` to stderr.

    Example::

        >>> print_progress("draftwise: converting...")  # doctest: +SKIP
    """
    print(message, file=sys.stderr, flush=True)


def gguf_cache_name(gguf_path: Path) -> str:
    """Name of the cache directory for ``gguf_path``: ``<stem>-<12 hex digits>``.

    The hash covers the resolved path, size and modification time, so an edited or
    replaced file is converted again.

    Example::

        >>> gguf_cache_name(Path("m.gguf"))  # doctest: +SKIP
        'm-3f2a9c0d1b7e'
    """
    resolved = gguf_path.resolve()
    st = resolved.stat()
    key = f"{resolved}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return f"{resolved.stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def convert_gguf(
    gguf_path: str | os.PathLike[str],
    progress: Progress | None = None,
    *,
    name: str | None = None,
) -> Path:
    """Convert ``gguf_path`` once into ``cache_dir()/models/<name>/`` and return that path.

    ``name`` defaults to :func:`gguf_cache_name`. An existing directory is reused.
    ``progress`` receives one-line status messages (default: printed to stderr).

    Example::

        >>> convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
        PosixPath('/home/me/.cache/draftwise/models/SmolLM2-135M-Instruct.Q4_1-5d0c...')
    """
    source = Path(gguf_path).expanduser()
    if not source.is_file():
        raise DraftwiseError(f"GGUF file not found: '{source}'")
    name = name or gguf_cache_name(source)
    parent = models_dir()
    target = parent / name
    if target.is_dir():  # fast path: renamed into place only when complete
        return target
    report = progress or print_progress
    with _locked(parent / f".{name}.lock"):
        if target.is_dir():  # another process finished while we waited
            return target
        for stale in parent.glob(f".{name}.tmp-*"):  # left by a killed conversion
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent))
        try:
            report(f"draftwise: converting {source.name} to {target} (one time, ~20 s)...")
            start = time.perf_counter()
            _write_hf_dir(source, tmp)
            record_source(tmp, source)
            _publish(tmp, target)
            report(f"draftwise: converted in {time.perf_counter() - start:.1f} s")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def record_source(model_dir: Path, gguf_path: Path) -> None:
    """Write ``source.json`` (atomically): the GGUF ``model_dir`` was converted from and
    each tensor's type there, from which the torch backend's ``4bit`` mode knows whether
    and where it can compute with the file's own 4-bit codes (``backends/gguf_q4.py``)."""
    record: dict[str, Any] = {"gguf": str(Path(gguf_path).resolve())}
    try:
        import gguf

        reader = gguf.GGUFReader(str(gguf_path))
        record["types"] = {t.name: t.tensor_type.name for t in reader.tensors}
    except Exception:  # noqa: BLE001 - best effort: gguf raises anything on a bad file
        pass  # no types: 4bit is then never this model's default
    tmp = model_dir / ".source.json.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, model_dir / "source.json")


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (a no-op where fcntl is missing)."""
    with open(lock_path, "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _publish(tmp: Path, target: Path) -> None:
    """Atomically rename the finished ``tmp`` directory to ``target``."""
    try:
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # a lost race is fine; anything else is not
            raise


def _write_hf_dir(source: Path, out: Path) -> None:
    """Load ``source`` with transformers (dequantised to float32) and write it to ``out``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        kwargs: dict[str, Any] = {"gguf_file": source.name}
        # transformers draws tqdm bars while dequantising; our callback reports instead.
        with contextlib.redirect_stderr(io.StringIO()):
            model = AutoModelForCausalLM.from_pretrained(
                source.parent, dtype=torch.float32, **kwargs
            )
            tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DraftwiseError(f"cannot convert GGUF file '{source}': {first_line}") from exc

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("torch_dtype", None)
    config["dtype"] = "float32"
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    config["_name_or_path"] = out.name
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(out)

    tokenizer.save_pretrained(out)
    _embed_chat_template(out, getattr(tokenizer, "chat_template", None))

    tied = bool(config.get("tie_word_embeddings"))
    state = {
        key: tensor.detach().to(torch.float32).contiguous()
        for key, tensor in model.state_dict().items()
        if not (tied and key == "lm_head.weight")
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    _apply_umask(out)


def _apply_umask(out: Path) -> None:
    """Give ``out`` (made 0700 by mkdtemp) and its files the usual umask-based modes."""
    umask = os.umask(0)
    os.umask(umask)
    out.chmod(0o777 & ~umask)
    for path in out.iterdir():
        path.chmod(0o666 & ~umask)


def _embed_chat_template(out: Path, template: str | None) -> None:
    """Also store the chat template inside ``tokenizer_config.json`` (older readers look there)."""
    path = out / "tokenizer_config.json"
    if not template or not path.is_file():
        return
    data = json.loads(path.read_text())
    data.setdefault("chat_template", template)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
