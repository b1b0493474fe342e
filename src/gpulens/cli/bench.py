"""`gpulens bench …`: honest baseline measurements. This module owns the `bench` group and its
`serve` command; other modules add commands to the same group by importing `bench_app`
(e.g. `cli/bench_train.py`: `@bench_app.command("train")`)."""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import typer

from gpulens.cli.common import console, console_err, store_option
from gpulens.cli.options import with_options
from gpulens.cli.serve_options import ServeOptions
from gpulens.errors import BadInputError, GateFailedError, GpulensError, UnavailableError, shown
from gpulens.safe_parse import read_bytes
from gpulens.units import parse_speed

bench_app = typer.Typer(
    name="bench",
    help="Measure: a load test of a serving endpoint (`serve`), training throughput (`train`).",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


class Arrival(str, Enum):
    constant = "constant"
    poisson = "poisson"
    gamma = "gamma"


class Format(str, Enum):
    table = "table"
    json = "json"


SERVE_HELP = """Load-test an HTTP or OpenAI-compatible endpoint, free of coordinated omission.

**Open loop** (`--rate R`): requests leave on a schedule (constant, Poisson or gamma arrivals,
optionally ramping to `--ramp-to`) whatever the server does, and each latency is counted from the
request's *intended* send time, so a stall is charged to every request that should have been sent
during it. **Closed loop** (`--concurrency C`): C users, each sending when its last answer arrives.

For `/v1/completions` and `/v1/chat/completions` the request is a streamed completion and the
report adds TTFT, inter-token latency (ITL) and TPOT = (latency − TTFT) / (output tokens − 1).

**Sweep** (`--sweep --slo "p99_latency<=500ms"`): the highest rate (or concurrency) at which
every SLO holds, by doubling then bisection, with goodput (requests/s meeting every SLO) per probe.
When every probe passes, the capacity was not found: the answer is "at least N" (raise `--max-rate`).

**Exit codes**: 0 when every `--slo` held and at most `--max-error-ratio` (default 0.01, i.e. 1 %)
of requests failed (errors, timeouts, rejections; an `error_rate` SLO replaces that bound);
**1** when a run missed an SLO or had more failures, or a sweep found no load meeting every SLO
(`--no-fail` reports and exits 0); 2 for bad input; 3 when the target cannot be reached or every
request failed.

Examples:

    gpulens bench serve --url http://127.0.0.1:8000/health --rate 200 --duration 30s
    gpulens bench serve --url http://127.0.0.1:8000/v1/completions --model my-model --rate 5 --arrival poisson
    gpulens bench serve --url http://127.0.0.1:8000/v1/chat/completions --concurrency 16 --requests 500
    gpulens bench serve --url http://host:8000/v1/completions --sweep --rate 2 --slo "p99_ttft<=300ms" --slo "p99_latency<=5s"

**Shaped traffic** (docs/inference.md): `--input-tokens uniform:200-2000 --output-tokens 256
--tokenizer ./model/` (token-exact; without `--tokenizer` an estimate), `--dataset sharegpt.json`
(`--multi-turn` for chats), `--prefix-tokens 1024 --prefix-groups 4`, and
`--replay-arrivals STORE|TRACE|MOONCAKE.jsonl --speed 2` for a recording's arrival times.
`--goodput 0.99` judges per request; `--report run.html` writes a page with charts.

Results: a table (or `--format json` on standard output), `--csv` with every request (with
`--sweep`: one row per probe), and a run in the store that `gpulens compare` can test later runs
against.
"""


@bench_app.command("serve", help=SERVE_HELP)
@with_options(ServeOptions)
def serve(
    opts: ServeOptions,
    concurrency: int = typer.Option(None, "--concurrency", help="Closed loop: this many users, each waiting for its answer."),
    arrival: Arrival = typer.Option(Arrival.constant, "--arrival", help="Open-loop arrival process."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape for --arrival gamma: 1 = Poisson, <1 burstier."),
    ramp_to: float = typer.Option(None, "--ramp-to", help="Ramp the rate linearly from --rate to this over --duration."),
    requests: int = typer.Option(None, "--requests", help="Stop after this many requests (with or instead of --duration)."),
    body: str = typer.Option(None, "--body", help="Request body, or @FILE to read it from a file."),
    header: list[str] = typer.Option([], "--header", "-H", help='Extra header "Name: value" (repeatable).'),
    sweep: bool = typer.Option(False, "--sweep", help="Find the highest rate/concurrency meeting every --slo."),
    max_concurrency: int = typer.Option(None, "--max-concurrency", min=1, help="Sweep (closed loop): probe no more users than this."),
    max_error_ratio: float = typer.Option(0.01, "--max-error-ratio", help="Fail (exit 1) when more than this share of requests fail or time out (0.01 = 1 %); an error_rate SLO replaces it."),
    no_fail: bool = typer.Option(False, "--no-fail", help="Report missed SLOs and failures but exit 0 (not 1)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Client processes sharing the load (add them when the client is the bottleneck). Their histograms merge exactly: counts, rates and every percentile are as from one process; per-request timelines line up only to the processes' start skew (docs/inference.md)."),
    max_connections: int = typer.Option(1000, "--max-connections", min=1, help="Open connections per worker at most."),
    insecure: bool = typer.Option(False, "--insecure", "-k", help="https: do not verify the server's certificate (a self-signed test server)."),
    seed: int = typer.Option(None, "--seed", help="Seed for Poisson/gamma arrivals, for a repeatable schedule."),
    input_tokens: str = typer.Option(None, "--input-tokens", help="Prompt length in tokens: N, uniform:A-B, normal:MEAN,SD or file:PATH (observed lengths)."),
    output_tokens: str = typer.Option(None, "--output-tokens", help="Output length in tokens (max_tokens), same forms as --input-tokens."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="Count tokens exactly: a local tokenizer.json or Hugging Face folder, or 'server' (its /tokenize). Without it, an estimate."),
    ignore_eos: bool = typer.Option(None, "--ignore-eos/--no-ignore-eos", help="Ask for exactly the output length (ignore_eos, min_tokens); on with --output-tokens. Off for servers that reject the fields."),
    dataset: str = typer.Option(None, "--dataset", help="Prompts from a file: ShareGPT JSON, JSONL of {prompt, output_tokens}, or chat JSONL of {messages}."),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="With --dataset: send every turn of each conversation, resending its history."),
    prefix_tokens: int = typer.Option(0, "--prefix-tokens", help="A shared prefix of this many tokens ahead of each prompt (what prefix caching buys)."),
    prefix_groups: int = typer.Option(1, "--prefix-groups", help="How many distinct shared prefixes, assigned round-robin."),
    replay_arrivals: str = typer.Option(None, "--replay-arrivals", help="Send at a recording's arrival times: a gpulens store, a trace (events.jsonl) or a mooncake JSONL."),
    replay_service: str = typer.Option(None, "--replay-service", help="With a store: replay this service's requests only."),
    speed: str = typer.Option("1", "--speed", help="Replay this many times as fast as recorded (a factor: 2 or 2x)."),
    replay_lengths: bool = typer.Option(False, "--replay-lengths", help="Replay the recording's prompt and output lengths too."),
    goodput: float = typer.Option(None, "--goodput", help="Judge per request: pass when this share of requests meets every --slo (the sweep searches for it)."),
    report: Path = typer.Option(None, "--report", help="Write a self-contained HTML report (charts, SLO verdicts) of the run or sweep to this path."),
    csv_path: Path = typer.Option(None, "--csv", help="Write every request (times, status, tokens) to this CSV; with --sweep, one row per probe."),
    fmt: Format = typer.Option(Format.table, "--format", help="table (human) or json (standard output)."),
    store: Path = store_option(),
    no_store: bool = typer.Option(False, "--no-store", help="Do not record the run in the store."),
) -> None:
    from gpulens.bench.serve import LoadSpec, run_load
    from gpulens.bench.serve import sweep as run_sweep
    from gpulens.bench.serve.traffic import TrafficOptions, plan_traffic

    opts.validate()
    slos = opts.slos()
    if sweep and not slos:
        raise BadInputError("--sweep needs at least one --slo to sweep against.", hint='E.g. --slo "p99_latency<=500ms".')
    rate = opts.sweep_rate(concurrency) if sweep else opts.rate
    target = opts.target(_body(body), _headers(header))
    duration_s = opts.duration_seconds(replay=replay_arrivals is not None)
    traffic = plan_traffic(
        TrafficOptions(input_tokens=input_tokens, output_tokens=output_tokens, tokenizer=tokenizer, ignore_eos=ignore_eos,
                       dataset=dataset, multi_turn=multi_turn, prefix_tokens=prefix_tokens, prefix_groups=prefix_groups,
                       replay=replay_arrivals, replay_service=replay_service, speed=parse_speed(speed), replay_lengths=replay_lengths,
                       seed=seed),
        url=opts.url, kind=target.kind, model=opts.model, stream=opts.stream, prompt=opts.prompt, max_tokens=opts.max_tokens,
        rate=rate, ramp_to=ramp_to, duration_seconds=duration_s,
        max_requests=requests, sweep=sweep)
    replay = traffic.arrivals
    spec = LoadSpec(
        target=target,
        rate=rate, concurrency=concurrency, arrival=arrival.value, burstiness=burstiness, ramp_to=ramp_to,
        duration_seconds=None if replay is not None else duration_s,
        max_requests=None if replay is not None else requests, timeout_seconds=opts.timeout_seconds,
        max_connections=max_connections, seed=seed, workers=workers, verify_tls=not insecure,
        workload=traffic.workload, arrivals=None if replay is None else replay.times_seconds,
    )
    spec.validate()
    out_json = fmt is Format.json

    if sweep:
        cap = max_concurrency if spec.mode == "closed" else opts.max_rate
        result = _with_progress(lambda progress_factory, tick: run_sweep(
            spec, slos, tolerance_ratio=opts.tolerance_ratio, max_probes=opts.max_probes, max_value=cap, progress_factory=progress_factory,
            on_tick=tick, on_probe=None if out_json else _print_probe, max_error_ratio=max_error_ratio,
            min_goodput_ratio=goodput))
        def keep_sweep() -> _Outputs:
            return _keep_outputs(
                csv_path, report, store, no_store, write_csv=lambda: _write_sweep_csv(result, csv_path),
                write_report=lambda: _write_report(report, spec, slos, sweep=result),
                save=lambda: _save(store, spec, result.probes[-1].result, opts.slo, {"sweep": result.to_dict()}) if result.probes else None)

        if out_json:
            outputs = keep_sweep()
            sys.stdout.write(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
        else:
            _render_sweep(result)  # the figures first: a failed write below never takes them away
            outputs = keep_sweep()
        outputs.raise_failure()
        if result.best is None and not no_fail:
            raise GateFailedError(f"No load tried met every SLO ({', '.join(result.slos)}).",
                                  hint="Lower the starting --rate (or --concurrency), or relax the SLOs; --no-fail exits 0.")
        return

    load = _with_progress(lambda progress_factory, tick: run_load(
        spec, slos, progress=progress_factory(), on_tick=tick, max_error_ratio=max_error_ratio,
        min_goodput_ratio=goodput))
    s = load.summary

    def keep() -> _Outputs:
        return _keep_outputs(csv_path, report, store, no_store, write_csv=lambda: _write_csv(load, csv_path),
                             write_report=lambda: _write_report(report, spec, slos, load=load), save=lambda: _save(store, spec, load, opts.slo))

    if out_json:
        from gpulens.bench.serve.vllm_compat import vllm_load_keys, vllm_result

        outputs = keep()  # JSON carries the run's id: written after, and printed whatever failed
        vllm = vllm_result(load.records, s.duration_seconds, slos=slos, **vllm_load_keys(spec))
        sys.stdout.write(json.dumps({**s.to_dict(), **vllm, "run_id": outputs.run_id}, indent=2, default=str) + "\n")
        for w in s.warnings:
            console_err.print(f"[yellow]warning:[/] {w}", highlight=False)
    else:
        _render_summary(s, None)  # the figures first: a failed write below never takes them away
        outputs = keep()
    outputs.raise_failure()
    kept = f" The results above are kept ({outputs.kept_text()})." if outputs.kept else ""
    if s.requests.total and s.requests.ok == 0:
        if s.requests.timeout == s.requests.total:
            hint = "The server accepts connections but does not answer: check that it is not stuck, or raise --timeout."
        elif "CERTIFICATE_VERIFY_FAILED" in (s.first_error or ""):
            hint = "The server's TLS certificate is not trusted here: add --insecure for a test server with a self-signed one."
        else:
            hint = "Check the URL, method and body against the server's API."
        from gpulens.http_client import redact_url

        raise _AllFailed(f"Every request to {redact_url(opts.url)} failed: {s.first_error or 'no response'}.", hint=hint + kept)
    if s.failures and not no_fail:
        raise GateFailedError(f"The run failed its gate: {'; '.join(s.failures)}.",
                              hint=("--no-fail reports without failing." + kept).strip())


@dataclass
class _Outputs:
    """What a run's outputs (CSV, store, report) became: each kept, or failed with its error."""

    kept: list[str] = field(default_factory=list)
    failed: list[tuple[str, GpulensError]] = field(default_factory=list)
    run_id: int | None = None

    def kept_text(self) -> str:
        return ", ".join(self.kept)

    def raise_failure(self) -> None:
        """The first failure, saying what was kept and what was not (its exit code kept: 4 for a full disk)."""
        if not self.failed:
            return
        what, err = self.failed[0]
        lost = ", ".join(w for w, _ in self.failed)
        kept = f"kept: {self.kept_text()}" if self.kept else "nothing else was kept"
        said = copy.copy(err)  # its class (and exit code) kept, whatever its constructor takes
        said.message = f"{err.message.rstrip('.')}. The run's figures are printed above; not kept: {lost}; {kept}."
        said.args = (said.message,)
        raise said


def _keep_outputs(csv_path: Path | None, report: Path | None, store: Path, no_store: bool, *,
                  write_csv: Callable[[], int], write_report: Callable[[], None], save: Callable[[], int | None]) -> _Outputs:
    """Write each output the run asked for; a failure of one is kept for the end and the others still go."""
    out = _Outputs()
    if csv_path is not None:
        _try_output(out, f"the CSV {csv_path}", write_csv)
    if not no_store:
        run_id = _try_output(out, f"the run in the store {store}", save, kept=lambda rid: f"run #{rid} in the store {store}")
        if run_id is not None:
            out.run_id = int(run_id)  # type: ignore[call-overload]
            console_err.print(f"[dim]stored as run #{out.run_id}[/]")
    if report is not None:
        _try_output(out, f"the report {report}", write_report)
    return out


def _try_output(out: _Outputs, what: str, write: Callable[[], object], kept: Callable[[object], str] | None = None) -> object:
    """Run one output's write; its failure is noted in `out` (not raised), its success named as kept."""
    try:
        got = write()
    except GpulensError as e:
        out.failed.append((what, e))
        return None
    if got is not None or kept is None:
        out.kept.append(kept(got) if kept is not None else what)
    return got


def _write_csv(load, csv_path: Path) -> int:  # noqa: ANN001
    from gpulens.bench.serve.output import write_csv

    n = write_csv(load, csv_path)
    console_err.print(f"[dim]wrote {n} requests to {csv_path}[/]")
    return n


def _write_sweep_csv(result, csv_path: Path) -> int:  # noqa: ANN001
    from gpulens.bench.serve.output import write_sweep_csv

    n = write_sweep_csv(result, csv_path)
    console_err.print(f"[dim]wrote {n} probes to {csv_path}[/]")
    return n


class _AllFailed(UnavailableError):
    """Every request of a load run failed: the target is not serving."""


def _headers(items: list[str]) -> dict[str, str]:
    out = {}
    for h in items:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise BadInputError(f"Cannot read the header {shown(h)}.", hint='Write --header "Name: value".')
        out[name.strip()] = value.strip()
    return out


def _body(body: str | None) -> bytes | None:
    if body is None:
        return None
    if body.startswith("@"):  # a regular file: @/dev/zero was read until memory ran out
        return read_bytes(body[1:], "the body file", hint="Give --body @PATH of a readable file.")
    return body.encode()


def _save(store: Path, spec, load, slo_texts, extra=None) -> int | None:
    from gpulens.bench.serve.output import save_result
    from gpulens.store import Store

    with Store(store) as s:
        return save_result(s, spec, load, slo_texts, extra)


def _write_report(path: Path, spec, slos, *, load=None, sweep=None) -> None:
    from gpulens.bench.serve.report_html import write_report

    write_report(path, spec, slos, load=load, sweep=sweep)
    console_err.print(f"[dim]wrote the report {path}[/]")


def _with_progress(fn):
    """Run `fn(progress_factory, on_tick)` under a live view on standard error (when it is a terminal)."""
    from rich.live import Live
    from rich.text import Text

    from gpulens.bench.serve import Progress

    current: list[Progress] = []

    def factory() -> Progress:
        current.append(Progress())
        return current[-1]

    def render() -> Text:
        if not current:
            return Text("starting…", style="dim")
        p = current[-1]
        elapsed = 0.0 if p.started_at is None else max(time.perf_counter() - p.started_at, 0.0)
        st = p.by_status
        line = (f"{elapsed:5.1f} s  sent {p.sent}" + (f"/{p.planned}" if p.planned else "") +
                f"  done {p.done}  in flight {p.in_flight}  ok {st['ok']}  errors {st['error']}  "
                f"timeouts {st['timeout']}  rejected {st['rejected']}")
        if p.latency is not None and p.latency.count:
            line += f"  p99 {p.latency.percentile(99) * 1e3:.1f} ms"
        return Text(line)

    if not console_err.is_terminal:
        return fn(factory, None)
    with Live(get_renderable=render, console=console_err, refresh_per_second=4, transient=True):
        return fn(factory, None)


def _ms(v: float | None) -> str:
    return "–" if v is None else (f"{v * 1e3:.2f}" if v < 10 else f"{v * 1e3:.0f}")


def _latency_caption(mode: str) -> str:
    if mode == "open":
        return ("latency: from each request's intended send time (open loop: includes queueing behind a stall); "
                "'from send': from its actual send, so it differs only by the client's send lag and still includes "
                "that queueing. A closed-loop tool sends fewer requests into a stall and reports less than either "
                "(--concurrency measures that)")
    return ("closed loop: each user sends when its previous answer arrives, so 'latency' and 'from send' coincide; "
            "this is what a closed-loop tool reports, and it hides a stall from all but the requests in flight")


def _render_summary(s, run_id: int | None) -> None:
    from rich.table import Table

    from gpulens.render import print_table

    if s.mode != "open":
        target = f"concurrency {s.target_concurrency}"
    elif s.target_rate is None:  # --replay-arrivals: the recording's own times set the rate
        target = f"{s.arrival} arrivals"
    elif s.target_ramp_to is not None:
        target = f"{s.target_rate:g} → {s.target_ramp_to:g} req/s ramp ({s.arrival} arrivals)"
    else:
        target = f"{s.target_rate:g} req/s {s.arrival}"
    rates = s.rates_per_second
    console.print(f"[bold]{target}[/] over {s.duration_seconds:.1f} s (first intended send to end of run): "
                  f"achieved {s.achieved_rate:.1f} req/s ok, {rates.error:.1f} errors/s, "
                  f"{rates.timeout:.1f} timeouts/s; sent {s.sent_rate:.1f} req/s")
    req = s.requests
    console.print(f"requests: {req.total} ({req.ok} ok, {req.error} errors, {req.timeout} timeouts, "
                  f"{req.rejected} rejected" + (f", {req.not_sent} not sent" if req.not_sent else "") + ")")
    t = Table(title="milliseconds", caption=_latency_caption(s.mode))
    t.add_column("", no_wrap=True)
    for c in ("p50", "p90", "p95", "p99", "p99.9", "mean", "max", "n"):
        t.add_column(c, justify="right", no_wrap=True)
    rows = [("latency", s.latency), ("from send", s.latency_uncorrected),
            ("TTFT", s.ttft), ("ITL", s.itl), ("TPOT", s.tpot), ("send lag", s.send_lag)]
    for name, d in rows:
        if d is not None:
            t.add_row(name, *(_ms(getattr(d, k)) for k in ("p50", "p90", "p95", "p99", "p99_9", "mean", "max")), str(d.count))
    print_table(console, t)
    if s.input_tokens_per_second:
        basis = {"estimate": " (estimated: no --tokenizer)", "server": " (counted by the server)"}.get(s.token_basis or "", "")
        console.print(f"input tokens: {s.input_tokens} ({s.input_tokens_per_second:.1f} tokens/s){basis}")
    if s.output_tokens_per_second:
        console.print(f"output tokens: {s.output_tokens} ({s.output_tokens_per_second:.1f} tokens/s)")
    if s.concurrency:
        c = s.concurrency
        console.print(f"concurrency (requests in flight, by time): mean {c.mean:.1f}, p50 {c.p50:g}, "
                      f"p90 {c.p90:g}, p99 {c.p99:g}, max {c.max:g}")
    for r in s.slo_results:
        mark = "[green]met[/]" if r.met else "[red]missed[/]"
        if not r.gating:
            mark += " [dim](reported; --goodput judges per request)[/]"
        console.print(f"SLO {r.slo}: {r.shown()} {mark}")
    if s.goodput is not None:
        ratio = "" if s.goodput_ratio is None else f" ({s.goodput_ratio:.1%} of requests)"
        console.print(f"goodput: {s.goodput:.1f} req/s meeting every SLO{ratio}")
    for w in s.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    if run_id is not None:
        console.print(f"[dim]stored as run #{run_id}[/]")


def _print_probe(p) -> None:
    s = p.result.summary
    verdict = "[green]pass[/]" if p.passed else "[red]fail[/] " + ", ".join(p.failed_slos)
    p99 = _ms(s.latency.p99) if s.latency else "–"
    console_err.print(f"probe {p.value:g}: achieved {s.achieved_rate:.1f} req/s, goodput {s.goodput or 0:.1f}, "
                      f"p99 {p99} ms: {verdict}", highlight=False)


def _render_sweep(r) -> None:
    from rich.table import Table

    from gpulens.render import print_table

    unit = "req/s" if r.mode == "open" else "users"
    t = Table(title=f"sweep against {', '.join(r.slos)}")
    for c in (unit, "achieved req/s", "goodput req/s", "p50 ms", "p99 ms", "verdict"):
        t.add_column(c, justify="right")
    for p in sorted(r.probes, key=lambda p: p.value):
        s = p.result.summary
        t.add_row(f"{p.value:g}", f"{s.achieved_rate:.1f}", f"{s.goodput or 0:.1f}",
                  _ms(s.latency.p50 if s.latency else None), _ms(s.latency.p99 if s.latency else None),
                  "pass" if p.passed else "fail: " + ", ".join(p.failed_slos))
    print_table(console, t)
    if r.best is None:
        console.print(f"[red]No load met every SLO[/] (lowest tried failed{': ' + r.note if r.note else ''}).")
    elif not r.limit_found:
        how = ("raise --max-rate" if r.mode == "open" else "raise --max-concurrency") if r.stopped_by == "max_value" else \
            "raise --max-probes, or start from a higher " + ("--rate" if r.mode == "open" else "--concurrency")
        console.print(f"[bold yellow]At least {r.best:g} {unit}[/]: every probe met every SLO, so the limit was not found; {how}.")
    else:
        console.print(f"[bold green]Highest {unit} meeting every SLO: {r.best:g}[/] (fails at {r.lowest_failing:g})")
    if r.note:
        console.print(f"[yellow]note:[/] {r.note}")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
