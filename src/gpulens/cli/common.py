"""Shared bits of the CLI: consoles and the options many commands take."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.segment import Segment

from gpulens.store import DEFAULT_STORE_PATH

# C0 controls but newline and tab, DEL and the C1 controls, shown as `cat -v` does (ESC is ^[). A name
# from a store, a trace or a note reaches the terminal as text: an ESC in it would otherwise retitle
# the window, move the cursor or hide what follows. rich's own styling is not text, so it stays.
_CARET = {c: f"^{chr(c + 64)}" for c in range(32) if chr(c) not in "\n\t"} | {127: "^?"} | {c: "?" for c in range(128, 160)}


def terminal_safe(text: str) -> str:
    """`text` with its control characters shown, not obeyed."""
    return text.translate(_CARET)


class _Shown:
    """A renderable whose text segments have their control characters shown (control segments,
    rich's own cursor moves, pass as they are)."""

    def __init__(self, inner: ConsoleRenderable):
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for seg in console.render(self.inner, options):
            yield seg if seg.control or seg.text.isprintable() or not seg.text else Segment(terminal_safe(seg.text), seg.style)


class _ShowControls(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Shown(r) for r in renderables]


def _console(**kwargs: object) -> Console:
    c = Console(**kwargs)  # type: ignore[arg-type]
    c.push_render_hook(_ShowControls())
    return c


console = _console()
console_err = _console(stderr=True)

STORE_HELP = "The gpulens store (an SQLite file). Default: .gpulens/gpulens.db"


def open_existing_store(store: Path, what: str,
                        hint: str = "Run `gpulens agent` (or `gpulens replay`) first, or point --store at your store.",
                        *, readonly: bool = False):  # noqa: ANN201
    """Open a store that must already exist (commands that read or annotate what was recorded):
    a missing file is a one-sentence error, never a new empty store. A command that only reads
    opens it `readonly`, so a store it may not write (a read-only folder, a copy from a node) answers."""
    from gpulens.errors import StoreError
    from gpulens.store import Store

    if not store.exists():
        raise StoreError(f"There is no store at {store}, so there are no {what}.", hint=hint)
    if store.is_file() and store.stat().st_size == 0:  # opened to write, it would get a schema: a read changing the file
        from gpulens.store.connect import empty_store

        raise empty_store(store)
    return Store(store, readonly=readonly)


def store_option(default: Path = DEFAULT_STORE_PATH) -> Path:
    return typer.Option(default, "--store", help=STORE_HELP)  # type: ignore[no-any-return]


# Options a user sets once for every command, read from the environment when not given on the
# command line (click's envvar; --help shows "env var: ..."). A flag here means the same in every
# command that has it, so one table covers the commands of today and those added later.
ENV_DEFAULTS: dict[str, str] = {
    "--store": "GPULENS_STORE",
    "--backend": "GPULENS_BACKEND",
    "--metric-names": "GPULENS_METRIC_NAMES",
    "--notify": "GPULENS_NOTIFY",  # repeatable: several targets separated by spaces
    "--token": "GPULENS_DASHBOARD_TOKEN",  # a secret is better kept out of shell history
}
# `gpulens demo` writes the bundled session to a store of its own, never into the user's.
ENV_EXEMPT_COMMANDS = frozenset({"demo"})


def apply_env_defaults(app: typer.Typer) -> list[tuple[str, str, str]]:
    """Give every option named in ENV_DEFAULTS its environment variable, in every command of `app`
    (sub-apps included). Returns (command, flag, variable) for each option changed."""
    import inspect

    from typer.models import OptionInfo

    done: list[tuple[str, str, str]] = []

    def visit(t: typer.Typer, path: str) -> None:
        for cmd in t.registered_commands:
            if cmd.callback is None:
                continue
            name = f"{path} {cmd.name or cmd.callback.__name__.replace('_', '-')}".strip()
            if name.split(" ")[0] in ENV_EXEMPT_COMMANDS:
                continue
            for p in inspect.signature(cmd.callback).parameters.values():
                opt = p.default
                if not isinstance(opt, OptionInfo) or opt.envvar:
                    continue
                for flag in opt.param_decls or ():
                    var = ENV_DEFAULTS.get(flag)
                    if var:
                        opt.envvar, opt.show_envvar = var, True
                        done.append((name, flag, var))
        for group in t.registered_groups:
            if group.typer_instance is not None:
                visit(group.typer_instance, f"{path} {group.name or ''}".strip())

    visit(app, "")
    return done
