"""`draftwise chat` in a real terminal (tmux): two turns, /stats, Ctrl-C mid-answer, one more turn.

The screen is read with ``tmux capture-pane -p``. tmux runs on its own socket so a
developer's tmux server is never touched.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
PROMPT = ">> "


def ensure_tmux() -> str:
    """The tmux binary, installed with apt-get when missing and we are root; else skip."""
    found = shutil.which("tmux")
    if found:
        return found
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "tmux"], capture_output=True, timeout=300
        )
        found = shutil.which("tmux")
    if not found:
        pytest.skip("tmux is not installed and could not be installed (apt-get install -y tmux)")
    return found


class Term:
    """One tmux session running a command in an 160x50 terminal."""

    def __init__(self, command: str) -> None:
        self.tmux = ensure_tmux()
        self.socket = f"draftwise-test-{uuid.uuid4().hex[:8]}"
        self.name = "chat"
        self._run("new-session", "-d", "-s", self.name, "-x", "160", "-y", "50", command)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.tmux, "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )

    def send(self, *keys: str) -> None:
        self._run("send-keys", "-t", self.name, *keys)

    def type(self, line: str) -> None:
        self._run("send-keys", "-t", self.name, "-l", line)
        self.send("Enter")

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-J", "-S", "-", "-t", self.name).stdout

    def alive(self) -> bool:
        return self._run("has-session", "-t", self.name).returncode == 0

    def wait(self, ok: Callable[[str], bool], what: str, timeout: float = 240) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = self.screen()
            if ok(text):
                return text
            if not self.alive():
                pytest.fail(f"chat exited while waiting for {what}")
            time.sleep(0.3)
        pytest.fail(f"timed out waiting for {what}; screen:\n{self.screen()}")

    def prompts(self) -> int:
        return sum(line.startswith(PROMPT.strip()) for line in self.screen().splitlines())

    def kill(self) -> None:
        self._run("kill-server")


@pytest.fixture
def term(default_model_dir) -> Iterator[Term]:
    cmd = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable,
            "-m",
            "draftwise",
            "chat",
            "--model",
            str(default_model_dir),
            "--backend",
            "torch",
            "--dtype",
            "float32",
            "--max-tokens",
            "600",
        ]
    )
    t = Term(f"cd {shlex.quote(str(REPO))} && exec {cmd}")
    yield t
    t.kill()


def ask(term: Term, line: str) -> str:
    """Type a line and wait for the answer to end (a new prompt)."""
    before = term.prompts()
    term.type(line)
    term.wait(
        lambda s: term.prompts() > before and s.rstrip().endswith(PROMPT.strip()),
        f"answer to {line!r}",
    )
    return term.screen()


def last_answer(screen: str, question: str) -> str:
    """The text printed between the last ``question`` line and the next prompt."""
    tail = screen[screen.rindex(question) + len(question) :]
    return tail[: tail.index("\n" + PROMPT.strip())].strip()


FRANCE = "What is the capital of France? Answer in one short sentence."


def test_chat_turns_stats_and_ctrl_c(term):
    term.wait(lambda s: PROMPT.strip() in s and "draftwise chat" in s, "the first prompt", 300)
    first = last_answer(ask(term, FRANCE), FRANCE)
    assert "Paris" in first
    screen = ask(term, "And what is the capital of Italy? One short sentence.")
    assert "Rome" in screen
    screen = ask(term, "/stats")
    assert "tokens/step" in screen and "tok/s" in screen

    before = term.prompts()
    start = len(term.screen())
    term.type("Write a very long story about a dragon who learns to bake bread, in many chapters.")
    term.wait(lambda s: len(s) > start + 120, "the long answer to start")
    term.send("C-c")
    screen = term.wait(
        lambda s: "[stopped]" in s and term.prompts() > before, "the answer to stop", 120
    )
    assert term.alive()

    question = "What is 2 + 2? Answer with a number."
    assert last_answer(ask(term, question), question)  # the session still answers
    # a fresh conversation after all that gives the first answer again (greedy)
    assert "[conversation reset]" in ask(term, "/reset")
    assert last_answer(ask(term, FRANCE), FRANCE) == first
    term.type("/quit")
    deadline = time.time() + 60
    while term.alive() and time.time() < deadline:
        time.sleep(0.3)
    assert not term.alive(), "chat did not exit on /quit"
