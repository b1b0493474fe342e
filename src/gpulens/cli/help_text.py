"""Help texts as written: each example in an "Examples:" block stays on its own line.

The CLI renders help as Markdown, where lines with no blank line between them are one paragraph: five
examples written one per line came out as one run-on paragraph. This gives each example line its own
paragraph, for every command and group, once, before the CLI is built.
"""

from __future__ import annotations

import inspect
import re

import typer

_EXAMPLES = re.compile(r"^\s*Examples?:\s*$", re.MULTILINE)


def keep_example_lines(text: str) -> str:
    """`text` with the lines of each "Examples:" block (up to the next blank-line-free end) as paragraphs."""
    out: list[str] = []
    in_examples = False
    for line in text.splitlines():
        if _EXAMPLES.match(line):
            in_examples = True
            out.append(line.strip())
            continue
        if in_examples:
            stripped = line.strip()
            if stripped and not line[:1].isspace() and not stripped.startswith("gpulens"):
                in_examples = False  # back to prose at the left margin
            elif stripped:
                if out and out[-1] != "":
                    out.append("")  # a blank line: a paragraph of its own
                out.append(stripped)
                continue
        out.append(line)
    return "\n".join(out)


def _fix(info) -> None:  # type: ignore[no-untyped-def]
    help_text = getattr(info, "help", None)
    if not isinstance(help_text, str):
        callback = getattr(info, "callback", None)
        help_text = inspect.getdoc(callback) if callback is not None else None
    if isinstance(help_text, str) and _EXAMPLES.search(help_text):
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
