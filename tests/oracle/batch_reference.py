#!/usr/bin/env python3
"""reference.py's output for several cases in one process (so mlx-lm is imported once).

batch_reference.py < cases.json

Each case: {"model": DIR, "prompt": TEXT, "max_tokens": N, "ignore_chat_template": bool}. Prints a
JSON list with reference.py's object (prompt_ids, tokens, text, logits, ...) per case.
"""

import json
import sys

from reference import run


def main():
    cases = json.load(sys.stdin)
    out = [run(c["model"], c["prompt"], c["max_tokens"], c.get("ignore_chat_template", False)) for c in cases]
    json.dump(out, sys.stdout, ensure_ascii=True)


if __name__ == "__main__":
    main()
