"""The user's command with `{NAME}` placeholders, filled in per trial.

`python train.py --batch-size {batch} --num-workers {workers=0}`: `{workers=0}` carries its
baseline value, which beginner mode starts from when no `--knob workers=...` is given. `{steps}`
is filled with the tune's `--steps`. A micro-batch change keeps the effective batch: an
accumulation placeholder (`{accum}`) is set to baseline micro-batch × accumulation / new micro-batch.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulens.errors import BadInputError
from gpulens.tune.knobs import ACCUMULATION_NAMES, BUILTIN, Knob

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:=([^{}]*))?\}")
STEPS = "steps"


@dataclass(frozen=True)
class CommandTemplate:
    argv: tuple[str, ...]

    @classmethod
    def of(cls, argv: Sequence[str] | str) -> CommandTemplate:
        args = tuple(shlex.split(argv) if isinstance(argv, str) else argv)
        if not args:
            raise BadInputError("No command to tune.", hint="Put your training command after --, e.g. -- python train.py --num-workers {workers}.")
        return cls(args)

    def placeholders(self) -> dict[str, str | None]:
        """Placeholder name -> the default written in it ({workers=0}), or None."""
        out: dict[str, str | None] = {}
        for arg in self.argv:
            for m in _PLACEHOLDER.finditer(arg):
                out[m.group(1)] = m.group(2) if m.group(2) is not None else out.get(m.group(1))
        return out

    def render(self, values: Mapping[str, str]) -> list[str]:
        def fill(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in values:
                return str(values[name])
            if m.group(2) is not None:
                return m.group(2)
            raise BadInputError(f"The command's placeholder {{{name}}} has no value.",
                                hint=f"Give --knob {name}=V1,V2 or write a default, {{{name}=VALUE}}.")

        return [_PLACEHOLDER.sub(fill, a) for a in self.argv]

    def check(self, knobs: Sequence[Knob], provided: Sequence[str] = ()) -> None:
        """Every knob must appear in the command, and every placeholder must get a value (from a
        knob, its default, `{steps}`, or a name in `provided` that the caller fills in)."""
        ph = self.placeholders()
        for k in knobs:
            if k.name not in ph:
                raise BadInputError(f"The knob {k.name!r} does not appear in the command, so changing it would change nothing.",
                                    hint=f"Write {{{k.name}}} where its value goes, e.g. --{k.name.replace('_', '-')} {{{k.name}}}.")
        named = {k.name for k in knobs} | {STEPS, *provided}
        for name, default in ph.items():
            if name not in named and default is None and not (name in ACCUMULATION_NAMES and _micro_batch(knobs)):
                raise BadInputError(f"The command's placeholder {{{name}}} has no value.",
                                    hint=f"Give --knob {name}=V1,V2 or write a default, {{{name}=VALUE}}.")


def _micro_batch(knobs: Sequence[Knob]) -> Knob | None:
    return next((k for k in knobs if k.meaning is BUILTIN["batch"]), None)


def fill_values(template: CommandTemplate, knobs: Sequence[Knob], setting: Mapping[str, str], steps: int | None) -> dict[str, str]:
    """The placeholder values of one trial: its knob values, `{steps}`, and an accumulation that
    keeps micro-batch × accumulation at the baseline's."""
    values = dict(setting)
    if steps is not None:
        values.setdefault(STEPS, str(steps))
    ph = template.placeholders()
    mb = _micro_batch(knobs)
    accum = next((n for n in ACCUMULATION_NAMES if n in ph and n not in setting), None)
    if mb is not None and accum is not None:
        base_accum = ph[accum] or "1"
        try:
            effective = int(mb.baseline) * int(base_accum)
            values[accum] = str(max(1, effective // max(1, int(setting[mb.name]))))
        except (ValueError, KeyError):
            raise BadInputError(f"The micro-batch {mb.name} and the accumulation {{{accum}}} must be whole numbers.",
                                hint=f"E.g. --knob {mb.name}=8,16 and {{{accum}=4}} in the command.") from None
    return values


def shell_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """A command line a user can paste into a shell."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + shlex.join(argv)
