"""More drafter-training prompts from the corpus's own text: chunks of ``docs.txt`` (CC0
PEPs) and ``code.txt`` (TheAlgorithms/Python, MIT) wrapped in instructions (summarise,
explain, extract, review, port, test), written in ``prompts.jsonl``'s format
(``id``, ``prompt``, ``response`` null, ``source``). The chat corpus has ~8.7k prompts;
these add prompts whose answers copy from and talk about a given text or program, as the
summarisation, extraction, RAG and coding requests a user sends do. Nothing here reads a
benchmark file.

Example::

    python scripts/corpus_doc_prompts.py --out /tmp/doc-prompts.jsonl
    cat ../shared/corpus/prompts.jsonl /tmp/doc-prompts.jsonl > /tmp/train-prompts.jsonl
    draftwise train-drafter --corpus /tmp/train-prompts.jsonl --out ~/redrafter ...
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from draftwise.core.atomic import atomic_file

CORPUS = Path(__file__).resolve().parents[1] / "../shared/corpus"

DOC_TASKS = (
    "{text}\n\nSummarize the text above in a few sentences.",
    "{text}\n\nList the key points of this text as bullet points.",
    "Explain the following in simple terms:\n\n{text}",
    "{text}\n\nWrite three questions a reader might ask about this text, and answer them.",
    "Extract every Python module, function, keyword or PEP number mentioned in this text:\n\n{text}",
    "Rewrite this passage more concisely:\n\n{text}",
    "{text}\n\nWhat problem does this describe, and what solution is proposed?",
    "Here is a passage from a Python Enhancement Proposal:\n\n{text}\n\nWhat is its main argument?",
)
CODE_TASKS = (
    "Explain what this Python code does:\n\n```python\n{text}\n```",
    "```python\n{text}\n```\n\nAdd docstrings and comments to this code.",
    "Find possible bugs in this code and suggest fixes:\n\n```python\n{text}\n```",
    "Rewrite this Python code in JavaScript:\n\n```python\n{text}\n```",
    "Write unit tests with pytest for the following code.\n\n```python\n{text}\n```",
    "```python\n{text}\n```\n\nWhat is the time complexity of this code? Explain.",
    "Refactor this code to make it more readable:\n\n```python\n{text}\n```",
)


def chunks(text: str, size: int, offset: int = 0) -> list[str]:
    """Runs of whole blank-line-separated blocks of about ``size`` characters (a block
    longer than ``size`` is cut at a line), starting ``offset`` blocks in.

    Example::

        >>> chunks("a\\n\\nb\\n\\nc", 4)
        ['a\\n\\nb', 'c']
    """
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()][offset:]
    out: list[str] = []
    cur = ""
    for b in blocks:
        if len(b) > size:  # a long block: cut at its lines
            b = "\n".join(b.split("\n")[: max(1, size // 60)])[: 2 * size]
        if cur and len(cur) + 2 + len(b) > size:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{b}" if cur else b
    if cur:
        out.append(cur)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--size", type=int, default=650, help="characters of text a prompt holds")
    p.add_argument("--passes", type=int, default=1, help="chunkings (offset by a block), each with other tasks")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.size < 100 or args.passes < 1:
        raise SystemExit(f"--size must be >= 100 and --passes >= 1, got {args.size}, {args.passes}")
    rng = random.Random(args.seed)
    rows = []
    for name, tasks in (("docs", DOC_TASKS), ("code", CODE_TASKS)):
        text = (args.corpus / f"{name}.txt").read_text(encoding="utf-8")
        if name == "code":  # drop the file banners
            text = re.sub(r"^# ===== .* =====$", "", text, flags=re.M)
        for k in range(args.passes):
            for i, c in enumerate(chunks(text, args.size, offset=k)):
                task = rng.choice(tasks)
                rows.append({"id": f"{name}-chunk-{k}-{i}", "prompt": task.format(text=c),
                             "response": None, "source": f"corpus/{name}.txt"})
    with atomic_file(args.out, "w") as f:  # a temp file, then a rename
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
