"""The spec loader fuzzed at scale: the cases of tests/test_fuzz_spec.py, by the ten thousand, counted.

Run: .venv/bin/python benchmarks/fuzz_spec.py [--examples 10000] [--seed 1]
(the test venv: it has hypothesis and the project.) Prints how many generated specs loaded, how many
were rejected (by kind of error) and every violation: a traceback, a message of more than one line, one
without FILE:LINE or naming a line the file does not have. Exit 1 when there was any.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, seed, settings

from tests.test_fuzz_spec import Case, check_case, spec_cases


def kind_of(message: str) -> str:
    """A rough class of a rejection, from its text after `FILE:LINE: `."""
    text = message.split(": ", 1)[1] if ": " in message else message
    lowered = text.lower()
    for word, kind in (
        ("invalid toml", "TOML syntax"),
        ("utf-8", "not UTF-8"),
        ("extends", "extends"),
        ("cycle", "reference cycle"),
        ("refers to", "reference"),
        ("unknown key", "unknown key"),
        ("missing", "missing key"),
        ("is not a table", "a section that is not a table"),
    ):
        if word in lowered:
            return kind
    return "a value of the wrong type or range"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    violations: list[tuple[Case, str]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-spec-") as tmp:
        directory = Path(tmp)

        @seed(args.seed)
        @settings(
            max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=spec_cases())
        def run(case: Case) -> None:
            try:
                outcome = check_case(directory, case)
            except AssertionError as exc:
                counts["violation"] += 1
                violations.append((case, str(exc)))
                return
            except Exception:
                counts["traceback"] += 1
                violations.append((case, traceback.format_exc()))
                return
            counts[outcome] += 1
            if outcome == "rejected":
                from reconcile.errors import SpecError
                from reconcile.spec.loader import load_spec

                try:
                    load_spec(str(directory / case.main))
                except SpecError as err:
                    kinds[kind_of(str(err))] += 1

        run()
    total = sum(counts.values())
    print(f"{total:,} generated specs in {time.monotonic() - started:.0f} s (seed {args.seed}):")
    for what in ("valid", "rejected", "violation", "traceback"):
        print(f"  {what:<10} {counts[what]:>7,}")
    print("rejections by kind:")
    for kind, n in kinds.most_common():
        print(f"  {kind:<36} {n:>7,}")
    for case, problem in violations[:20]:
        print(f"\nVIOLATION: {problem}\n  files: { {k: v[:300] for k, v in case.files.items()} }")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
