"""A bench-format prompt file of *copying* tasks made from ``../shared/corpus`` (no
benchmark overlap): quote, list or annotate a PEP paragraph (``docs.txt``) or a Python
function (``code.txt``), so the answer repeats spans of the prompt. A held-out set for the
choices that depend on copied text (``auto``'s full way), which ordinary corpus prompts
rarely exercise.

Categories: ``copy-doc`` (``--docs`` prompts over paragraphs of 300-900 characters) and
``copy-code`` (``--code`` prompts over functions of 300-900 characters), picked with a
fixed seed.

Example::

    python scripts/corpus_copy_prompts.py --out /tmp/copy-dev.jsonl
    draftwise bench --prompts /tmp/copy-dev.jsonl --drafters none,auto --max-tokens 128 \\
        --out runs/copy-dev
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "../shared/corpus"
DOC_TASKS = (
    "Extract every sentence of the text below that contains a number or a name, quoted "
    "exactly.\n\n{}",
    "Rewrite the text below as a bulleted list, keeping its original wording.\n\n{}",
    "Quote the two most important sentences from the text below, word for word.\n\n{}",
    "Answer using only the text below: what is it about? Quote the relevant passage.\n\n{}",
)
CODE_TASKS = (
    "Add type hints to this Python function and return the whole function.\n\n{}",
    "Rename the variables in this function to clearer names and show the full code.\n\n{}",
)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", type=Path, default=CORPUS, help="the corpus directory")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--docs", type=int, default=12, help="copy-doc prompts")
    p.add_argument("--code", type=int, default=8, help="copy-code prompts")
    p.add_argument("--seed", type=int, default=5)
    args = p.parse_args()
    for name in ("docs.txt", "code.txt"):
        if not (args.corpus / name).is_file():
            p.error(f"--corpus {args.corpus} has no {name}")
    if args.docs < 0 or args.code < 0:
        p.error(f"--docs and --code must be >= 0, got {args.docs}, {args.code}")
    text = (args.corpus / "docs.txt").read_text(encoding="utf-8")
    paras = [s.strip() for s in text.split("\n\n") if 300 < len(s.strip()) < 900]
    code = (args.corpus / "code.txt").read_text(encoding="utf-8")
    funcs = [c for c in re.split(r"\n(?=def )", code)
             if 300 < len(c) < 900 and c.startswith("def ")]
    rng = random.Random(args.seed)
    rng.shuffle(paras)
    rng.shuffle(funcs)
    rows = [{"id": f"copy-doc-{i}", "category": "copy-doc",
             "turns": [DOC_TASKS[i % len(DOC_TASKS)].format(paras[i])]}
            for i in range(min(args.docs, len(paras)))]
    rows += [{"id": f"copy-code-{i}", "category": "copy-code",
              "turns": [CODE_TASKS[i % len(CODE_TASKS)].format(funcs[i])]}
             for i in range(min(args.code, len(funcs)))]
    tmp = args.out.with_name(args.out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    tmp.replace(args.out)
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
