"""Embed draftwise in an app: one Session, a worker thread, a stop button, saved drafter state.

python examples/embed.py
"""

import threading

from draftwise import CancelToken, Session

with Session(cache_dir="~/.cache/draftwise/embed-example") as session:  # saves on exit
    print(session.generate("Name three primes.", max_tokens=32))

    stop = CancelToken()  # a UI's "stop" button would call stop.cancel()
    pieces: list[str] = []

    def worker() -> None:  # generation off the UI thread; the session lock queues callers
        for r in session.stream("Tell me a long story.", cancel=stop, max_tokens=400):
            pieces.append(r.text)
            if len(pieces) == 20:
                stop.cancel()  # stops at the next step; the KV cache stays consistent

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    print("".join(pieces), "[stopped]")
    print(session.generate("And now a haiku.", max_tokens=24))  # works as before
