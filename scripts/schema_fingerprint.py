"""The schema pipeline's fingerprint over a corpus: per schema, its lowered form, the
rewrites, each backend's declarations and auto's admission (compact and flexible
whitespace), hashed. Run it before and after a change that should not change what the
pipeline decides; the digests must match (`--json` files name the schemas that differ).

    .venv/bin/python scripts/schema_fingerprint.py ../shared/corpus/maskbench [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

import grammarmask as gm
from grammarmask.tools.known_vocabs import load_vocabulary


def record(compiler: gm.GrammarCompiler, schema: Any) -> dict[str, Any]:
    """What the pipeline decides about one schema."""
    try:
        compact = gm.Grammar.json_schema(schema)
        flexible = gm.Grammar.json_schema(schema, whitespace="flexible")
    except gm.GrammarError as exc:
        return {"error": str(exc)}
    lowered = compact.lower()
    assert lowered is not None
    found: dict[str, Any] = {
        "lowered": lowered.source,
        "rewrites": [str(rewrite) for rewrite in lowered.rewrites],
        "strict_integers": lowered.strict_integers,
    }
    for name in compiler.auto_candidates():
        for grammar in (compact, flexible):
            try:
                declared = compiler.backend(name).unenforced(grammar, grammar.lower())
                found[f"{name}/{grammar.whitespace}"] = [str(item) for item in declared]
            except gm.GrammarError as exc:
                found[f"{name}/{grammar.whitespace}"] = str(exc)
    for grammar in (compact, flexible):
        try:
            compiler.check(grammar, "auto")
            found[f"auto/{grammar.whitespace}"] = "admitted"
        except gm.GrammarError as exc:
            found[f"auto/{grammar.whitespace}"] = str(exc)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="a MaskBench-format folder")
    parser.add_argument("--json", type=Path, help="write each schema's digest here")
    args = parser.parse_args()
    compiler = gm.GrammarCompiler(load_vocabulary("deepseek"))
    total = hashlib.sha256()
    digests: dict[str, str] = {}
    for path in tqdm(sorted(args.corpus.glob("*.json")), desc="schemas", unit="schema"):
        text = json.dumps(
            record(compiler, json.loads(path.read_text(encoding="utf-8"))["schema"]),
            sort_keys=True,
        )
        digests[path.name] = hashlib.sha256(text.encode()).hexdigest()
        total.update(path.name.encode() + text.encode())
    compiler.close()
    if args.json:
        args.json.write_text(json.dumps(digests, indent=0), encoding="utf-8")
    print(f"{len(digests)} schemas, digest {total.hexdigest()}")


if __name__ == "__main__":
    main()
