"""An embedding API for desktop apps and servers: one model, one generation at a time.

A ``Session`` owns a loaded ``Model`` and a lock. Every generation holds the lock from
its first step to its last, so callers on several threads queue up instead of corrupting
the KV cache or the drafters' state. The ``Decoder`` underneath rewinds its cache in a
``finally``, so a generation that is cancelled, closed early or interrupted leaves the
cache consistent and the next one reuses the common prefix.

Lifecycle::

    session = Session(cache_dir="~/.cache/myapp")   # load the model; load saved drafter state
    text = session.generate("Hi!", max_tokens=32)    # blocking, thread-safe
    for r in session.stream(messages, on_token=print_piece):   # streaming, thread-safe
        ...                                          # break / close() / cancel() stop it
    session.cancel()                                 # from another thread: stop the current one
    session.save()                                   # write drafter state (also done by close)
    session.close()                                  # save, then refuse further generations

``Session`` is also a context manager (``with Session() as s: ...`` closes it).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from draftwise.core.drafters.compose import Persistent
from draftwise.errors import DraftwiseError

MAX_REQUEST_BUDGET = 64  # draft tree nodes a client's request may ask for

if TYPE_CHECKING:  # the API imports torch-side modules; load it only when a Session is made
    from draftwise.api import GenerationResponse, Model, Prompt
    from draftwise.core.drafters import Drafter


class CancelToken:
    """A flag another thread sets to stop a generation at its next step.

    Example::

        >>> tok = CancelToken()
        >>> tok.cancel(); tok.cancelled
        True
    """

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class StopText:
    """Finds stop strings in streamed text and holds back what could start one.

    Example::

        >>> s = StopText(["END"])
        >>> s.feed("abc E"), s.feed("ND more"), s.stopped
        ('abc ', '', True)
    """

    def __init__(self, stops: Sequence[str]) -> None:
        for s in stops:
            if not isinstance(s, str) or not s:
                raise DraftwiseError(f"stop strings must be non-empty text, got {s!r}")
        self.stops = list(stops)
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add ``text``; return what is safe to show (everything before a stop string)."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._pending + text
        cut = min((i for s in self.stops if (i := buf.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._pending = True, ""
            return buf[:cut]
        keep = 0  # the longest tail of buf that begins some stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back text, once generation ended without a stop string."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out


class Session:
    """A thread-safe handle on one model for an app: queued generations, cancellation,
    drafter state that persists across calls (and across runs with ``cache_dir``).

    ``model`` is a loaded ``draftwise.Model`` or anything ``draftwise.load`` accepts
    (``None`` = the embedded default; ``backend``, ``dtype`` and ``invariant`` as in
    ``load``). Defaults for ``stream``/``generate`` (drafter, budget, max_tokens, ...)
    come from ``defaults``. See the module docstring for the lifecycle.

    ``stream(..., state="id")`` drafts with drafters that only that id's generations
    taught (a server gives each API key its own); at most ``max_states`` such sets are
    kept, the least recently used dropped. Without ``state`` the drafters are shared and
    their state is what ``save`` writes. ``keep_prefixes=N`` keeps copies of finished
    generations' KV caches (N tokens in all, per ``state``; see ``core/prefixes.py``), so
    a conversation's next turn prefills only what is new even after other requests.

    Example::

        >>> with Session(drafter="cacheback") as s:                     # doctest: +SKIP
        ...     print(s.generate("Name three primes.", max_tokens=24))
    """

    def __init__(
        self,
        model: Model | str | os.PathLike[str] | None = None,
        *,
        backend: str = "auto",
        dtype: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        invariant: bool | str = "auto",
        max_states: int = 8,
        keep_prefixes: int = 0,
        **defaults: Any,
    ) -> None:
        from draftwise.api import Model, load

        if isinstance(model, Model):
            self.model: Model = model
        else:
            self.model = load(model, backend, dtype, invariant)
        if max_states < 1:
            raise DraftwiseError(f"max_states must be >= 1, got {max_states}")
        self.max_states = max_states
        if keep_prefixes:
            from draftwise.core.prefixes import Prefixes

            self.model.decoder.prefixes = Prefixes(keep_prefixes)
        self._states: OrderedDict[str, OrderedDict[str, Drafter]] = OrderedDict()
        self.defaults: dict[str, Any] = {"drafter": "auto", **defaults}
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self._lock = threading.Lock()
        self._current: CancelToken | None = None
        self._closed = False
        self.load_errors: list[str] = []  # drafter files that could not be loaded
        self._keep: set[Path] = set()  # files that failed to load: never overwritten
        if self.cache_dir is not None:
            self.load_state(self.cache_dir)

    # -- generation ---------------------------------------------------------------------

    def stream(
        self,
        prompt: Prompt,
        *,
        cancel: CancelToken | None = None,
        on_token: Callable[[GenerationResponse], None] | None = None,
        stop: Sequence[str] = (),
        remote: bool = False,
        state: str | None = None,
        **kwargs: Any,
    ) -> Generator[GenerationResponse, None, None]:
        """Yield a ``GenerationResponse`` per step, holding the session lock meanwhile.

        ``remote=True`` marks options that came from a client (a request to an app):
        they are checked with ``check_remote`` first.

        Stops cleanly at the next step when ``cancel`` (or ``Session.cancel()``) fires,
        or when the caller closes the iterator. ``stop`` strings end generation when the
        text contains one (the stop string and what follows are trimmed; the last
        response then has ``finish_reason="stop"``). ``on_token`` is called with each
        response before it is yielded. ``state`` picks a separate set of drafters (see
        the class docstring). Other options are those of ``draftwise.stream_generate``.
        """
        if remote:
            self.check_remote(kwargs)
        opts = {**self.defaults, **kwargs}
        stops = StopText(list(stop))  # checks the strings before queueing
        token = cancel or CancelToken()
        return self._run(prompt, token, on_token, stops, opts, state)

    def _drafters_of(self, state: str) -> OrderedDict[str, Drafter]:
        """The drafters of ``state`` (made empty on first use), now most recently used."""
        drafters = self._states.pop(state, None)
        if drafters is None:
            drafters = OrderedDict()
            while len(self._states) >= self.max_states:
                self._states.popitem(last=False)
        self._states[state] = drafters
        return drafters

    def _run(
        self,
        prompt: Prompt,
        token: CancelToken,
        on_token: Callable[[GenerationResponse], None] | None,
        stops: StopText,
        opts: dict[str, Any],
        state: str | None = None,
    ) -> Generator[GenerationResponse, None, None]:
        from draftwise.api import stream_generate

        with self._lock:
            if self._closed:
                raise DraftwiseError("this session is closed")
            self._current = token
            shared = self.model.drafters
            if state is not None:  # one generation at a time: swapping is safe here
                self.model.drafters = self._drafters_of(state)
            self.model.decoder.prefix_key = state
            inner = cast(
                "Generator[GenerationResponse, None, None]",
                stream_generate(self.model, prompt, **opts),
            )
            try:
                while not token.cancelled:  # checked before each step is computed
                    r = next(inner, None)
                    if r is None:
                        break
                    text = stops.feed(r.text)
                    if stops.stopped:
                        r = dataclasses.replace(r, text=text, finish_reason="stop")
                    elif r.finish_reason is not None:
                        r = dataclasses.replace(r, text=text + stops.flush())
                    elif text != r.text:
                        r = dataclasses.replace(r, text=text)
                    if on_token is not None:
                        on_token(r)
                    yield r
                    if stops.stopped:
                        break
            finally:
                inner.close()  # the decoder rewinds its cache here
                self.model.drafters = shared
                self._current = None

    def check_remote(self, options: dict[str, Any]) -> None:
        """Raise ``DraftwiseError`` unless a client may ask for ``options``: a drafter
        other than the session's own must be a registry name with remote-safe options
        only, none needing an asset that is not built yet (no file paths, no allocations,
        no minutes-long build while holding the model), and ``budget`` at most
        ``MAX_REQUEST_BUDGET``."""
        from draftwise.drafting import check_spec

        drafter = options.get("drafter", self.defaults["drafter"])
        if drafter != self.defaults["drafter"]:
            if not isinstance(drafter, str):
                raise DraftwiseError(f"a client's drafter must be a spec string, got {type(drafter).__name__}")
            check_spec(drafter, remote=True, max_budget=MAX_REQUEST_BUDGET, ready=self.model.assets.ready)
        budget = {**self.defaults, **options}.get("budget", 16)
        if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= MAX_REQUEST_BUDGET:
            raise DraftwiseError(f"budget must be an integer in 0..{MAX_REQUEST_BUDGET}, got {budget!r}")

    def generate(self, prompt: Prompt, **kwargs: Any) -> str:
        """The whole answer as one string (same options as ``stream``); blocks while
        another generation runs."""
        return "".join(r.text for r in self.stream(prompt, **kwargs))

    def cancel(self) -> None:
        """Stop the generation running now (if any) at its next step; thread-safe."""
        current = self._current
        if current is not None:
            current.cancel()

    @property
    def busy(self) -> bool:
        """Whether a generation holds the session now."""
        return self._lock.locked()

    def check_loaded(self) -> None:
        """Raise, naming the files, when saved drafter state could not be loaded (an app
        refuses to start rather than run without it; the files are left as they are)."""
        if self.load_errors:
            raise DraftwiseError(
                "saved drafter state cannot be loaded (move the file away, or start with "
                "another --cache-dir; it was not changed): " + "; ".join(self.load_errors)
            )

    def reset(self) -> None:
        """Drop the KV cache (drafters keep what they learnt); waits for the lock."""
        with self._lock:
            self.model.decoder.reset()

    # -- drafter state ------------------------------------------------------------------

    def _persistent(self) -> dict[str, Persistent]:
        return {n: d for n, d in self.model.drafters.items() if isinstance(d, Persistent)}

    def save(self, directory: str | os.PathLike[str] | None = None) -> list[Path]:
        """Write the state of every named drafter that supports it into ``directory``
        (default: ``cache_dir``) as ``<name>.drafter``; returns the files written. A file
        that failed to load when the session started is left as it is."""
        target = Path(directory).expanduser() if directory is not None else self.cache_dir
        if target is None:
            raise DraftwiseError(
                "no directory to save to: pass one or create the Session with cache_dir"
            )
        target.mkdir(parents=True, exist_ok=True)
        ident = self.model.tokenizer.identity()
        written = []
        with self._lock:
            for name, drafter in self._persistent().items():
                path = target / f"{name}.drafter"
                if path.resolve() in self._keep:
                    continue
                drafter.save(path, ident)
                written.append(path)
        return written

    def load_state(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Load every ``<name>.drafter`` file in ``directory`` into the drafter of that
        name; a file that cannot be loaded is noted in ``load_errors`` and skipped."""
        root = Path(directory).expanduser()
        names = {p.stem for p in root.glob("*.drafter")} if root.is_dir() else set()
        loaded = []
        for name in sorted(names):
            try:
                drafter = self.model.drafter(name)  # created now if not used yet
            except DraftwiseError:
                continue  # a drafter this version does not know
            if not isinstance(drafter, Persistent):
                continue
            path = root / f"{name}.drafter"
            try:
                drafter.load(path, self.model.tokenizer.identity())
                loaded.append(path)
            except (DraftwiseError, OSError, ValueError) as exc:
                self.load_errors.append(f"{path}: {exc}")
                self._keep.add(path.resolve())
        return loaded

    def close(self) -> None:
        """Save drafter state (with ``cache_dir``), then refuse new generations."""
        if self._closed:
            return
        self.cancel()
        if self.cache_dir is not None:
            self.save()
        with self._lock:
            self._closed = True
            self.model.close_drafters()  # stops worker threads (CARD)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
