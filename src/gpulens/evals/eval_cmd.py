"""`quant check --eval-cmd`: the user's own evaluation, run once on the baseline model folder and
once on the quantized one, each writing per-example scores that the `eval compare` gate pairs.

The command names the model folder `{model}` and the file it writes `{out}` (a plain JSONL,
`{"id": ..., "<metric>": value}` per line, or an lm-eval `--log_samples` output folder), e.g.

    python my_eval.py --model {model} --out {out}
    lm_eval --model hf --model_args pretrained={model} --tasks mytask --log_samples --output_path {out}

The quantized folder is a Hugging Face folder that `from_pretrained` loads as it is
(`quantize.save_quantized`), so any harness that reads a model folder evaluates it unchanged.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpulens.errors import BadInputError

PLACEHOLDERS = ("{model}", "{out}")
TAIL_CHARS = 400  # of the command's own error output, quoted when it fails
DEFAULT_TIMEOUT_SECONDS = 3600.0


@dataclass(frozen=True)
class EvalCommand:
    argv: tuple[str, ...]
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    @classmethod
    def of(cls, text: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> EvalCommand:
        try:
            argv = tuple(shlex.split(text))
        except ValueError as e:
            raise BadInputError(f"Cannot read --eval-cmd: {e}.", hint="Quote it as one shell word, e.g. --eval-cmd 'python eval.py --model {model} --out {out}'.") from None
        missing = [p for p in PLACEHOLDERS if not any(p in a for a in argv)]
        if not argv or missing:
            raise BadInputError(f"--eval-cmd must name {' and '.join(missing or PLACEHOLDERS)}.",
                                hint="gpulens fills in the model folder and the scores file: e.g. 'python eval.py --model {model} --out {out}'.")
        return cls(argv, timeout_seconds)

    def render(self, model: Path, out: Path) -> list[str]:
        return [a.replace("{model}", str(model)).replace("{out}", str(out)) for a in self.argv]

    def run(self, model: Path, out: Path, label: str) -> None:
        """Run on one model folder; a failure is one sentence naming the model and quoting the tail
        of the command's own error output."""
        argv = self.render(model, out)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=self.timeout_seconds,
                                  stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            raise BadInputError(f"The eval command {argv[0]!r} was not found.", hint="Give a program on PATH or its full path.") from None
        except subprocess.TimeoutExpired:
            raise BadInputError(f"The eval command on the {label} model ran past {self.timeout_seconds:g} s and was stopped.") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-TAIL_CHARS:]
            raise BadInputError(f"The eval command failed on the {label} model (exit code {done.returncode}).",
                                hint=f"Its output ended with: {tail}" if tail else "It printed nothing.")
        if not out.exists():
            raise BadInputError(f"The eval command on the {label} model wrote nothing to {{out}} ({out}).",
                                hint='Write one JSON object per example, {"id": ..., "<metric>": value}, to the path given as {out}.')
