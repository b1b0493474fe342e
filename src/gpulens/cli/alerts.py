"""`gpulens alerts`: the alert history, Prometheus rule export and silences."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console, open_existing_store
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.vocab.time import format_span, format_when

alerts_app = typer.Typer(
    help="Alerts raised by the agent (and `gpulens replay`): history, silences, and rules for Prometheus.",
    no_args_is_help=True,
)


@alerts_app.command("list")
def alerts_list_command(
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    active: bool = typer.Option(False, "--active", help="Only pending and firing alerts."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, newest first."),
    fmt: str = typer.Option("table", "--format", help="table or json (one object per alert, times in unix seconds)."),
) -> None:
    """List alerts, newest first: pending, firing and resolved ones with their advice.

        gpulens alerts list
        gpulens alerts list --active --format json
    """
    from gpulens.alerts.engine import load_alerts
    from gpulens.errors import BadInputError, shown

    if fmt not in ("table", "json"):
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use table or json.")
    with open_existing_store(store, "alerts", readonly=True) as st:
        alerts = load_alerts(st, active_only=active, limit=limit)
    if fmt == "json":
        typer.echo(json.dumps([a.to_json() for a in alerts], indent=2))
        return
    if not alerts:
        console.print("No alerts" + (" active." if active else " yet."))
        return
    # One block per alert rather than a table: summaries and advice are sentences, and stay readable at 80 columns.
    colour = {"critical": "red", "warning": "yellow", "info": "blue"}
    for a in alerts:
        state = a.state + (" (silenced)" if a.silenced else "")
        when = format_span(a.fired_at or a.active_since, a.resolved_at)
        console.print(f"[bold]{escape(a.rule)}[/] [{colour.get(a.severity, 'white')}]{escape(a.severity)}[/] {escape(f'{state}  {when}')}", highlight=False)
        console.print(f"  {escape(a.summary)}", highlight=False)
        if a.advice:
            console.print(f"  [dim]→ {escape(a.advice)}[/]", highlight=False)


@alerts_app.command("export")
def alerts_export_command(
    fmt: str = typer.Option("prometheus", "--format", help="prometheus (a rules file for Prometheus's rule_files)."),
    out: Path = typer.Option(None, "--out", help="Write to this file instead of stdout."),
    rules: Path = typer.Option(None, "--rules", help="Your rules file (YAML) on top of the built-in packs."),
    store: Path = typer.Option(None, "--store", help="Store whose learned baselines become the thresholds of learned rules. "
                               "Default: .gpulens/gpulens.db when it exists."),
) -> None:
    """Write the alert rules as Prometheus alerting rules (`promtool check rules` accepts them).

    Absolute rules translate as written. Learned rules become one rule per learned series with the
    band as a constant; rules on store events have no Prometheus form. Left-out rules are listed at
    the top of the file.

        gpulens alerts export --format prometheus --out gpulens-rules.yml
        promtool check rules gpulens-rules.yml
    """
    from gpulens.alerts.export import RuleGroup, export_prometheus
    from gpulens.alerts.rules import load_rules
    from gpulens.errors import BadInputError, shown
    from gpulens.scaling.promql import recording_rules

    if fmt != "prometheus":
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use --format prometheus.")
    rs = load_rules(rules)
    if store is None and DEFAULT_STORE_PATH.exists():
        store = DEFAULT_STORE_PATH
    scaling = (RuleGroup("gpulens-scaling", recording_rules()),)  # the scaling signal, next to the alerts
    if store is not None:
        with open_existing_store(store, "learned baselines", readonly=True) as st:
            res = export_prometheus(rs, st, extra_groups=scaling)
    else:
        res = export_prometheus(rs, extra_groups=scaling)
    if out is None:
        typer.echo(res.text, nl=False)
        return
    from gpulens.files import write_atomically

    write_atomically(out, res.text, what="the rules file", hint="Free some space or choose a writable --out path.")
    console.print(escape(f"Wrote {res.exported} Prometheus rules to {out}") + (f"; left out {len(res.skipped)} (see the file's header)." if res.skipped else "."))


@alerts_app.command("silence")
def alerts_silence_command(
    matchers: list[str] = typer.Argument(None, help='Label matchers: alertname=GpuXid, gpu=0, xid=~"79|48", host!=node3.'),
    duration: str = typer.Option("2h", "--for", help="How long the silence lasts, e.g. 30m, 2h, 1d."),
    comment: str = typer.Option("", "--comment", help="Why (shown in --list)."),
    list_: bool = typer.Option(False, "--list", help="List the silences in force instead of adding one."),
    expire: int = typer.Option(None, "--expire", help="End the silence with this id now."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
) -> None:
    """Silence alerts whose labels match, for a while: they are still recorded, but not notified.

        gpulens alerts silence alertname=GpuXid gpu=3 --for 4h --comment "RMA ticket 1234"
        gpulens alerts silence --list
        gpulens alerts silence --expire 2
    """
    from gpulens.alerts.engine import add_silence, expire_silence, list_silences, parse_matcher
    from gpulens.errors import BadInputError
    from gpulens.units import parse_duration

    now = time.time()
    if list_ and expire is not None:
        raise BadInputError("Give --list or --expire, not both.", hint="List first, then end one: `--expire ID`.")
    if (list_ or expire is not None) and matchers:
        raise BadInputError(f"--{'list' if list_ else 'expire'} takes no label matchers.",
                            hint="Matchers say what a new silence covers: leave them out, or leave out the option.")
    if list_ or expire is not None:
        with open_existing_store(store, "silences") as st:
            if expire is not None:
                expire_silence(st, expire, now)
                console.print(f"Silence {expire} ended.")
                return
            silences = list_silences(st, now)
        if not silences:
            console.print("No silences in force.")
        for s in silences:
            m = " ".join(f"{label}{op}{value}" for label, op, value in s.matchers)
            console.print(escape(f"{s.id}: {m} until {format_when(s.ends_at)}" + (f" - {s.comment}" if s.comment else "")), highlight=False)
        return
    if not matchers:
        raise BadInputError("Say which alerts to silence.", hint="Give label matchers, e.g. `gpulens alerts silence alertname=GpuXid gpu=0`.")
    parsed = [parse_matcher(m) for m in matchers]
    seconds = parse_duration(duration, what="--for")
    with open_existing_store(store, "alerts to silence") as st:
        s = add_silence(st, parsed, starts_at=now, ends_at=now + seconds, comment=comment)
    console.print(f"Silence {s.id} in force until {format_when(s.ends_at)}.")


def register(app: typer.Typer) -> None:
    app.add_typer(alerts_app, name="alerts")
