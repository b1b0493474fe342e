"""Help texts as written: each example command line stays on its own line.

The CLI renders help as Markdown, where lines with no blank line between them are one paragraph: five
examples written one per line came out as one run-on paragraph. This gives each example line (an indented
`gpulens ...` line, or one under "Examples:") its own paragraph, for every command and group, once, before
the CLI is built.
"""

from __future__ import annotations

import inspect
import re

import typer

_EXAMPLES = re.compile(r"^\s*Examples?:\s*$", re.MULTILINE)


def keep_example_lines(text: str) -> str:
    """`text` with every example command line as a paragraph of its own. An example line starts with
    `gpulens ` and is indented, under "Examples:", or opens a paragraph (or follows another example)."""
    text = inspect.cleandoc(text)
    out: list[str] = []
    in_examples = False
    previous = ""  # "blank", "example" or "text"
    for line in text.splitlines():
        stripped = line.strip()
        if _EXAMPLES.match(line):
            in_examples = True
        elif stripped and not line[:1].isspace() and not stripped.startswith("gpulens "):
            in_examples = False  # back to prose at the left margin
        example = stripped.startswith("gpulens ") and (
            in_examples or line[:1].isspace() or previous in ("", "blank", "example"))
        if stripped and (example or previous == "example") and out and out[-1] != "":
            out.append("")  # a blank line before: Markdown starts a new paragraph
        out.append(stripped if example else line)
        previous = "example" if example else ("text" if stripped else "blank")
    return "\n".join(out)


def _fix(info) -> None:  # type: ignore[no-untyped-def]
    help_text = getattr(info, "help", None)
    if not isinstance(help_text, str):
        callback = getattr(info, "callback", None)
        help_text = inspect.getdoc(callback) if callback is not None else None
    if isinstance(help_text, str) and "gpulens " in help_text:
        info.help = keep_example_lines(help_text)


def keep_examples_everywhere(app: typer.Typer) -> None:
    """Apply `keep_example_lines` to every command and group help under `app`."""
    _fix(app.info)
    if app.registered_callback is not None:
        _fix(app.registered_callback)
    for command in app.registered_commands:
        _fix(command)
    for group in app.registered_groups:
        _fix(group)
        if group.typer_instance is not None:
            keep_examples_everywhere(group.typer_instance)
