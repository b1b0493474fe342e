"""Rich tables that stay correct at 80 columns and in a pipe.

Rich's own answer to a table wider than the terminal is to cut cells to "1,…", squeeze a column to nothing
or crop the last ones. Here the widths are chosen from the cells instead: a column whose cells are single
tokens (numbers, "–") never wraps and keeps its widest cell; other columns fold at spaces, never below their
longest word, and share what room is left. When even that cannot fit, the table is drawn lighter, and then
wider than the terminal rather than with a figure lost. In a pipe rich writes plain text (no ANSI codes).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def _plain(cell: object) -> str | None:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except Exception:  # not valid markup: its characters are what is shown
            return cell
    return None  # another renderable: rich measures it


def _is_value(tokens: list[str]) -> bool:
    """A number, alone or with its unit ("58 %", "1881 MHz", "0.0055 n=6")."""
    if len(tokens) == 1:
        return True
    return len(tokens) == 2 and tokens[0].lstrip("+-−")[:1].isdigit() and not tokens[1][:1].isdigit()


def _interval(tokens: list[str]) -> tuple[str, str] | None:
    """An interval of values ("-24.7% … +23.1%") as its two lines when folded: ("-24.7% …", "+23.1%")."""
    for sep in ("…", "–", "to"):
        if sep in tokens:
            i = tokens.index(sep)
            if 0 < i < len(tokens) - 1 and _is_value(tokens[:i]) and _is_value(tokens[i + 1:]):
                return " ".join(tokens[:i + 1]), " ".join(tokens[i + 1:])
            return None
    return None


def _is_figure(text: str) -> bool:
    """One token ("1,555", "–"), a value with its unit ("58 %", "1881 MHz") or an interval of them
    ("-24.7% … +23.1%"): never cut, and folded, if at all, only after an interval's separator."""
    tokens = text.split()
    return len(tokens) <= 1 or _is_value(tokens) or _interval(tokens) is not None


def _least_figure_chars(text: str) -> int:
    """The narrowest a figure can be drawn: whole, or an interval over two lines, each end whole
    (an interval of extreme values, "+89.7% … +15210.5%", would otherwise widen a table past 80)."""
    widths = [0]
    for line in text.splitlines():
        pair = _interval(line.split())
        widths.append(max(len(pair[0]), len(pair[1])) if pair else len(line))
    return max(widths)


@dataclass(frozen=True)
class _Span:
    least_chars: int  # never narrower: the widest number (an interval folded), or the longest word
    whole_chars: int  # every figure on one line (intervals unfolded); the least for a text column
    most_chars: int  # the widest cell: no use being wider
    single_token: bool


def _span(column) -> _Span:  # type: ignore[no-untyped-def]
    texts = [t for t in (_plain(c) for c in column.cells) if t is not None]
    header = _plain(column.header) or ""
    single = all(_is_figure(t) for t in texts)
    widest = max([len(line) for t in [*texts, header] for line in t.splitlines()] or [1])
    header_word = max([len(w) for w in header.split()] or [1])
    if single:
        # the figures are kept whole (an interval may fold after its separator); a header of several
        # words ("max batch") may fold over its lines
        least = max([_least_figure_chars(t) for t in texts] + [header_word])
        whole = max([len(line) for t in texts for line in t.splitlines()] + [least])
        return _Span(least, whole, widest, True)
    longest_word = max([len(w) for t in texts for w in t.split()] + [header_word])
    return _Span(longest_word, longest_word, widest, False)


def _overhead(console: Console, options: ConsoleOptions, table: Table) -> int:
    """Characters the table adds to its columns (padding, rules): a probe table with the same frame and
    one-character columns, measured (measuring the table itself counts its long cells in)."""
    probe = Table(box=table.box, padding=table.padding, collapse_padding=table.collapse_padding,
                  pad_edge=table.pad_edge, show_edge=table.show_edge, show_header=False, expand=False)
    for _ in table.columns:
        probe.add_column(width=1, min_width=1, no_wrap=True)
    probe.add_row(*["x"] * len(table.columns))
    return Measurement.get(console, options, probe).maximum - len(table.columns)


def compact(table: Table) -> Table:
    """Fewer characters around the columns: no vertical rules or edges, one space between columns
    (a box's column divider is itself a character, so with one the cells get no padding)."""
    table.box = box.SIMPLE_HEAD if table.box is not None else None
    table.padding = (0, 0) if table.box is not None else (0, 1)
    table.collapse_padding = True
    table.pad_edge = False
    table.show_edge = False
    return table


def fit_table(table: Table, console: Console, options: ConsoleOptions | None = None) -> int:
    """Fix every column's width for `options.max_width`; returns the table's width (more than the room
    only when the numbers and longest words alone need more)."""
    options = options or console.options
    room = options.max_width
    spans = [_span(c) for c in table.columns]
    for column in table.columns:
        column.overflow = "fold"
        # a figures column is never narrower than its widest figure, so only its header can wrap
        column.no_wrap = False
    if sum(s.most_chars for s in spans) + _overhead(console, options, table) > room:
        compact(table)
    overhead = _overhead(console, options, table)
    widths = [s.least_chars for s in spans]
    spare = room - overhead - sum(widths)
    # the room left goes first to unfolding intervals, then to the folding columns, each up to its
    # widest cell, narrowest need first
    for target in (lambda s: s.whole_chars, lambda s: s.most_chars):
        for i in sorted(range(len(spans)), key=lambda i: target(spans[i]) - widths[i]):
            grow = max(0, min(spare, target(spans[i]) - widths[i]))
            widths[i] += grow
            spare -= grow
    for column, w in zip(table.columns, widths, strict=True):
        column.width = w
        column.min_width = w
    total = sum(widths) + overhead
    table.width = total if total > room else None
    if table.expand and total <= room:
        table.width = None
    return total


@dataclass
class FittedTable:
    """A table fitted when it is drawn, to whatever width the console (or a Live display) offers.
    Where even its numbers cannot fit, the `optional` columns go first (in that order), and a caption
    names them, rather than the display cropping whatever is rightmost without a word."""

    table: Table
    optional: tuple[str, ...] = ()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        hidden = []
        total = fit_table(self.table, console, options)
        for name in self.optional:
            if total <= options.max_width:
                break
            index = next((i for i, c in enumerate(self.table.columns) if _plain(c.header) == name), None)
            if index is None:
                continue
            self.table.columns.pop(index)
            hidden.append(name)
            total = fit_table(self.table, console, options)
        if hidden:
            self.table.caption = f"hidden at {options.max_width} columns: {', '.join(hidden)} (widen the terminal)"
            self.table.caption_justify = "left"
        yield self.table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)


def print_table(console: Console, table: Table) -> None:
    """Print `table` fitted to `console`; wider than the console rather than with a number cut."""
    total = fit_table(table, console)
    console.print(table, crop=total <= console.width)
