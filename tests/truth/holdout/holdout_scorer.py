"""Score `gpulens diagnose` on the held-out set with tests/truth/scorer.py's own rules.

scorer.py reads its cases from one folder (its CASES); this wrapper runs the same replay, diagnose
and `score` on tests/truth/holdout/cases without changing it, and prints the same table.

    python tests/truth/holdout/holdout_scorer.py [--case NAME] [--why]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1]) not in sys.path:  # run as a script: make `truth` importable as pytest does
    sys.path.insert(0, str(HERE.parents[1]))

from truth import scorer  # noqa: E402

CASES = HERE / "cases"


def case_names() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if (p / "truth.json").is_file())


def load_truth(case: str) -> dict[str, Any]:
    return json.loads((CASES / case / "truth.json").read_text(encoding="utf-8"))


def run_case(case: str, workdir: Path | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Replay the held-out case into a new store with the CLI and diagnose it: (truth, findings)."""
    truth = load_truth(case)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        store = str(Path(tmp) / "truth.db")
        scorer._gpulens(["replay", str(CASES / case), "--store", store, *truth["replay_args"]])
        out = scorer._gpulens(["diagnose", "--store", store, "--format", "json", *truth["diagnose_args"]])
    return truth, json.loads(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Score gpulens diagnose on the held-out truth set.")
    ap.add_argument("--case", action="append", help="only this case (repeatable); default: every case")
    ap.add_argument("--why", action="store_true", help="also list what keeps each case from passing")
    args = ap.parse_args(argv)
    scores = [scorer.score(*run_case(case)) for case in args.case or case_names()]
    print(scorer.table(scores))
    if args.why:
        for s in scores:
            print(f"\n{s.case}: " + ("passes" if not s.problems() else "; ".join(s.problems())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
