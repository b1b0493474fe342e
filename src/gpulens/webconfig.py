"""The Prometheus exporter-toolkit web-config file (`--web-config FILE`): TLS and basic auth for the
agent's `/metrics` and the dashboard, read from the same YAML node-exporter and dcgm-exporter read
with `--web.config.file`, so one file and one habit serve the whole node.

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file, as in the toolkit
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional: mutual TLS
      client_ca_file: clients-ca.crt
      min_version: TLS12             # the toolkit's default
    basic_auth_users:
      prometheus: $2b$12$...          # bcrypt hashes only (htpasswd -nBC 12 "" | tr -d ':\\n')

What the toolkit accepts and gpulens cannot honour (cipher_suites, RequireAnyClientCert, ...) is
refused with one sentence rather than silently ignored: a TLS setting that is not applied is worse
than an error. Checking a password needs the `bcrypt` package (`pip install 'gpulens[auth]'`),
imported only when the file names users.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError
from gpulens.safe_parse import UnsafeYaml, read_text, yaml_value

# The toolkit's client_auth_type values that Python's ssl can enforce: it has no "ask for a
# certificate but do not verify it" mode, so RequestClientCert and RequireAnyClientCert are refused.
CLIENT_AUTH_MODES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
# Keys of the toolkit's tls_server_config that gpulens does not apply (refused by name).
_TLS_UNSUPPORTED = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites",
                    "client_allowed_sans"}
_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
# A password checked once is remembered (by a keyed digest, never in clear) so a scrape every few
# seconds does not pay bcrypt's deliberate ~0.2 s each time; the toolkit caches the same way.
AUTH_CACHE_ENTRIES = 1024
# Checked for an unknown user, so a wrong name costs as long as a wrong password (no user probing).
_DUMMY_HASH = b"$2b$10$C3HQUloWo5uckHJekDWTaepohNtd7htlZlaxPtYD3grTuJ/sBlzNC"


def _bad(path: Path, what: str, hint: str = "See docs/metrics.md (TLS and basic auth) for the file's keys.") -> BadInputError:
    return BadInputError(f"The web config {path}: {what}", hint=hint)


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """A server context, loaded now so a wrong certificate or key is one sentence at startup."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version is not None:
            ctx.maximum_version = TLS_VERSIONS[self.max_version]
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise BadInputError(f"Cannot load the TLS certificate {self.cert_file} with the key {self.key_file}: "
                                f"{getattr(e, 'strerror', None) or e.args[-1]}.",
                                hint="Check that both are PEM files and that the key belongs to the certificate.") from None
        ctx.verify_mode = CLIENT_AUTH_MODES[self.client_auth_type]
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as e:
                raise BadInputError(f"Cannot load the client CA {self.client_ca_file}: "
                                    f"{getattr(e, 'strerror', None) or e.args[-1]}.",
                                    hint="client_ca_file must be a PEM file of the CA that signs client certificates.") from None
        return ctx


@dataclass
class BasicAuth:
    """user -> bcrypt hash. `check` takes an Authorization header's value."""

    users: dict[str, str]
    _cache: dict[bytes, bool] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def check(self, authorization: str | None) -> bool:
        user, password = _parse_basic(authorization)
        if user is None or password is None:
            return False
        hashed = self.users.get(user)
        digest = hmac.new(self._key, b"\0".join([user.encode(), password.encode(), (hashed or "").encode()]),
                          hashlib.sha256).digest()
        with self._lock:
            known = self._cache.get(digest)
        if known is not None:
            return known
        bcrypt = require_bcrypt()
        try:
            ok = bcrypt.checkpw(password.encode(), hashed.encode() if hashed else _DUMMY_HASH) and hashed is not None
        except ValueError:  # a hash bcrypt cannot read (checked at load; kept safe here)
            ok = False
        with self._lock:
            if len(self._cache) >= AUTH_CACHE_ENTRIES:
                self._cache.clear()
            self._cache[digest] = ok
        return ok


def _parse_basic(authorization: str | None) -> tuple[str | None, str | None]:
    if not authorization or not authorization[:6].lower() == "basic ":
        return None, None
    try:
        user, sep, password = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    return (user, password) if sep else (None, None)


@dataclass(frozen=True)
class WebConfig:
    path: Path
    tls: TlsConfig | None = None
    basic_auth: BasicAuth | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.ssl_context() if self.tls is not None else None


def require_bcrypt() -> Any:
    try:
        import bcrypt
    except ImportError:
        raise BadInputError("basic_auth_users needs the bcrypt package, which is not installed.",
                            hint="Install the auth extra: pip install 'gpulens[auth]'.") from None
    return bcrypt


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check the file; every mistake is one sentence naming the key (exit 2)."""
    path = Path(path)
    text = read_text(path, "the web config", hint="Pass the path of an existing YAML file.")
    try:
        doc = yaml_value(text)
    except UnsafeYaml as e:
        raise _bad(path, f"cannot be read: {e}.") from None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise _bad(path, "must be a YAML mapping (tls_server_config, basic_auth_users).")
    unknown = sorted(set(map(str, doc)) - _TOP_KEYS)
    if unknown:
        raise _bad(path, f"has an unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_TOP_KEYS))}).")
    if doc.get("http_server_config"):
        raise _bad(path, "http_server_config (HTTP/2, response headers) is not supported by gpulens.",
                   hint="Remove http_server_config; TLS and basic auth are supported.")
    tls = _tls(path, doc.get("tls_server_config"))
    auth = _auth(path, doc.get("basic_auth_users"))
    return WebConfig(path=path, tls=tls, basic_auth=auth)


def _tls(path: Path, raw: Any) -> TlsConfig | None:
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise _bad(path, "tls_server_config must be a mapping (cert_file, key_file, ...).")
    keys = set(map(str, raw))
    if keys & _TLS_UNSUPPORTED:
        raise _bad(path, f"tls_server_config.{sorted(keys & _TLS_UNSUPPORTED)[0]} is not supported by gpulens.",
                   hint="Use cert_file, key_file, client_auth_type, client_ca_file, min_version and max_version.")
    if keys - _TLS_KEYS:
        raise _bad(path, f"tls_server_config has an unknown key {sorted(keys - _TLS_KEYS)[0]!r}.")
    for key in ("cert_file", "key_file"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise _bad(path, f"tls_server_config needs {key} (a PEM file).")
    auth_type = str(raw.get("client_auth_type") or "NoClientCert")
    if auth_type not in CLIENT_AUTH_MODES:
        raise _bad(path, f"client_auth_type {auth_type!r} is not one gpulens can enforce "
                         f"(use {', '.join(CLIENT_AUTH_MODES)}).")
    ca = raw.get("client_ca_file")
    if auth_type != "NoClientCert" and not ca:
        raise _bad(path, f"client_auth_type {auth_type} needs client_ca_file (the CA that signs client certificates).")
    versions = {}
    for key in ("min_version", "max_version"):
        v = raw.get(key)
        if v is not None and str(v) not in TLS_VERSIONS:
            raise _bad(path, f"tls_server_config.{key} {v!r} is not one of {', '.join(TLS_VERSIONS)}.")
        versions[key] = None if v is None else str(v)
    here = path.parent

    def resolve(p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else here / q

    return TlsConfig(cert_file=resolve(raw["cert_file"]), key_file=resolve(raw["key_file"]), client_auth_type=auth_type,
                     client_ca_file=resolve(str(ca)) if ca else None,
                     min_version=versions["min_version"] or "TLS12", max_version=versions["max_version"])


def _auth(path: Path, raw: Any) -> BasicAuth | None:
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise _bad(path, "basic_auth_users must map user names to bcrypt hashes.")
    users: dict[str, str] = {}
    for user, hashed in raw.items():
        if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT_PREFIXES) or len(hashed) != 60:
            raise _bad(path, f"the password of user {str(user)!r} is not a bcrypt hash ($2b$..., 60 characters).",
                       hint="Hash it with: htpasswd -nBC 12 \"\" | tr -d ':\\n' (or python -c 'import bcrypt; ...').")
        if ":" in str(user):
            raise _bad(path, f"the user name {str(user)!r} contains ':', which basic auth cannot carry.")
        users[str(user)] = hashed
    require_bcrypt()  # at startup, not at the first scrape
    return BasicAuth(users)
