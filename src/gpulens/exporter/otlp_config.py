"""What `gpulens agent --otlp URL` was asked for, checked before anything starts: the OTLP/HTTP
endpoint, how often to export, and the headers sent with each export (auth, tenant). No OpenTelemetry
import here: a wrong flag is one sentence whether or not the SDK is installed.

Header values are secrets (a bearer token, an API key): only their names are ever shown."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpulens.errors import BadInputError
from gpulens.http_client import check_http_url, redact_url

DEFAULT_INTERVAL_SECONDS = 15.0  # a Prometheus scrape's usual cadence: the same resolution over OTLP
MAX_TIMEOUT_SECONDS = 10.0  # one export's bound (the SDK's own default), never past the interval
# RFC 9110 token characters: what a header name may be made of
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@dataclass(frozen=True)
class OtlpConfig:
    endpoint: str  # the full OTLP/HTTP metrics URL, e.g. http://127.0.0.1:4318/v1/metrics
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # values are secrets: not in repr

    @property
    def timeout_seconds(self) -> float:
        """One export (retries included) gives up after this long: the SDK's 10 s, or the interval
        when that is shorter, so a hung collector never holds more than one export."""
        return min(MAX_TIMEOUT_SECONDS, self.interval_seconds)

    def describe(self) -> str:
        """How the agent's start line shows it: the redacted URL and the header names, never values."""
        names = f" with header{'s' if len(self.headers) > 1 else ''} {', '.join(sorted(self.headers))}" if self.headers else ""
        return f"OTLP to {redact_url(self.endpoint)} every {self.interval_seconds:g} s{names}"


def check_otlp_url(url: str) -> str:
    """An OTLP/HTTP endpoint must be http(s)://HOST[:PORT]/PATH: anything else is one sentence."""
    return check_http_url(url, "--otlp", "the Collector's OTLP/HTTP metrics address, e.g. --otlp http://127.0.0.1:4318/v1/metrics")


def parse_otlp_header(text: str) -> tuple[str, str]:
    """`NAME=VALUE` -> (NAME, VALUE). The value never appears in a message: it is usually a secret."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not _HEADER_NAME.match(name):
        shown = name if name and _HEADER_NAME.match(name) else "the text before '='"
        raise BadInputError(f"--otlp-header takes NAME=VALUE with a header name ({shown} is not one followed by '=').",
                            hint="e.g. --otlp-header 'Authorization=Bearer <token>' (repeatable).")
    if "\n" in value or "\r" in value:
        raise BadInputError(f"--otlp-header {name}: the value holds a line break, which no HTTP header may carry.",
                            hint="Pass the value on one line.")
    return name, value.strip()


def otlp_config(url: str | None, interval_seconds: float | None, headers: list[str]) -> OtlpConfig | None:
    """The agent's three --otlp flags as one config (None without --otlp); the other two need it."""
    if url is None:
        if headers or interval_seconds is not None:
            flag = "--otlp-header" if headers else "--otlp-interval"
            raise BadInputError(f"{flag} needs --otlp URL, the Collector to export to.",
                                hint="Add --otlp http://COLLECTOR:4318/v1/metrics.")
        return None
    if interval_seconds is not None and interval_seconds <= 0:
        raise BadInputError("--otlp-interval must be longer than 0 s.", hint="e.g. --otlp-interval 15s.")
    return OtlpConfig(check_otlp_url(url), interval_seconds or DEFAULT_INTERVAL_SECONDS,
                      dict(parse_otlp_header(h) for h in headers))
