"""Certificates made at test time with the `openssl` binary (installed by .ci/run): a CA, a server
certificate for 127.0.0.1, ::1 and localhost signed by it, and a client certificate for mutual TLS;
and bcrypt hashes for the web-config file's basic_auth_users."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from testlib import which_or_skip


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([which_or_skip("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=gpulens test CA", cwd=folder)
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "san.cnf"]), ("client", [])):
        _run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=gpulens test {name}", cwd=folder)
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", *ext, cwd=folder)
    return Certs(folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "client.crt", folder / "client.key")


def bcrypt_hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()  # cost 4: the lowest, tests only
