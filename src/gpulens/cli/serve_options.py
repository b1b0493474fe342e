"""The options `bench serve` and `tune serve` share, declared once: the endpoint, the request,
the SLOs and the sweep. Both commands generate their flags from `ServeOptions`
(`cli.options.with_options`), so a default or a help line is the same in both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulens.cli.options import option, parse_ratio
from gpulens.units import parse_duration

if TYPE_CHECKING:
    from gpulens.bench.serve import Slo, Target

DEFAULT_DURATION = "10s"
SWEEP_START_RATE = 1.0  # requests/s a sweep starts at when neither --rate nor --concurrency is given


@dataclass(frozen=True)
class ServeOptions:
    """Raw values as a user gives them; `None` means "not given"."""

    url: str = option(("--url",), "The endpoint, e.g. http://127.0.0.1:8000/v1/completions.")
    rate: float | None = option(("--rate",), "Open loop: requests per second (the sweep's starting point with --sweep).", None)
    duration: str | None = option(("--duration",), "How long to send (per probe with --sweep): 30s, 2m. Default 10s; "
                                                   "with --replay-arrivals, the whole recording.", None)
    timeout: str = option(("--timeout",), "Per-request timeout; a request past it counts as a timeout.", "30s")
    method: str | None = option(("--method",), "HTTP method (default GET; POST for completions or with --body).", None)
    model: str = option(("--model",), "Model name sent to an OpenAI-compatible endpoint.", "default")
    prompt: str = option(("--prompt",), "Prompt for completions.", "Explain how a GPU schedules warps.")
    max_tokens: int = option(("--max-tokens",), "Tokens to generate per completion.", 64, min=1)
    stream: bool = option(("--stream/--no-stream",), "Stream completions (needed for TTFT and ITL).", True)
    slo: list[str] = option(("--slo",), 'Objective, e.g. "p99_latency<=500ms", "p95_ttft<=200ms", "error_rate<=1%".', [])
    tolerance: str = option(("--tolerance",), "Sweep: stop bisecting when the bracket is this close (a ratio: 0.05 or 5%).", "0.05")
    max_probes: int = option(("--max-probes",), "Sweep: at most this many probes.", 14, min=1)
    max_rate: float | None = option(("--max-rate",), "Sweep (open loop): probe no higher than this many requests/s.", None)

    def validate(self) -> None:
        """What typer cannot check by type: the --tolerance ratio."""
        self.tolerance_ratio  # noqa: B018 - parsing is the check

    def slos(self) -> list[Slo]:
        from gpulens.bench.serve import parse_slos

        return parse_slos(self.slo)

    @property
    def tolerance_ratio(self) -> float:
        """--tolerance as a ratio: 0.05 or 5%."""
        return parse_ratio(self.tolerance, "--tolerance")

    def duration_seconds(self, *, replay: bool = False) -> float | None:
        """Per run (or probe); None with a replay and no --duration: the whole recording."""
        text = self.duration if self.duration is not None or replay else DEFAULT_DURATION
        return parse_duration(text, what="--duration") if text else None

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout, what="--timeout")

    def sweep_rate(self, concurrency: int | None = None) -> float | None:
        """Where a sweep starts: --rate, or 1 req/s when neither --rate nor --concurrency is given."""
        return self.rate if self.rate is not None or concurrency is not None else SWEEP_START_RATE

    def kind(self) -> str:
        from gpulens.bench.serve import target_kind_for

        return target_kind_for(self.url)

    def target(self, body: bytes | None = None, headers: dict[str, str] | None = None) -> Target:
        """The request: `body` as given, else a completion for an OpenAI-compatible URL; POST with a body."""
        from gpulens.bench.serve import Target, openai_body

        kind = self.kind()
        headers = dict(headers or {})
        if kind != "http" and body is None:
            body = openai_body(kind, model=self.model, prompt=self.prompt, max_tokens=self.max_tokens, stream=self.stream)
            headers.setdefault("Content-Type", "application/json")
        return Target(url=self.url, method=(self.method or ("POST" if body is not None else "GET")).upper(), body=body,
                      headers=headers, kind=kind, stream=self.stream)

