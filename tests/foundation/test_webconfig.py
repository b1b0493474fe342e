"""The exporter-toolkit web-config file: what it accepts, and one sentence (exit 2) for every
mistake, named by its key; from the CLI too, without a traceback."""

from __future__ import annotations

import ssl
import subprocess
import sys

import pytest
from testlib import import_or_skip
from tlslib import bcrypt_hash, make_certs

from gpulens.errors import BadInputError
from gpulens.webconfig import load_web_config


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def _load(tmp_path, text: str):  # noqa: ANN001, ANN202
    (tmp_path / "web.yml").write_text(text)
    return load_web_config(tmp_path / "web.yml")


def test_an_empty_file_means_plain_http(tmp_path):
    wc = _load(tmp_path, "")
    assert wc.tls is None and wc.basic_auth is None and wc.scheme == "http" and wc.ssl_context() is None


def test_tls_paths_are_relative_to_the_file_and_build_a_context(tmp_path, certs):
    for p in (certs.server_cert, certs.server_key, certs.ca):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    wc = _load(tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                         "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n  min_version: TLS13\n")
    assert wc.tls.cert_file == tmp_path / "server.crt" and wc.scheme == "https"
    ctx = wc.ssl_context()
    assert ctx.verify_mode == ssl.CERT_OPTIONAL and ctx.minimum_version == ssl.TLSVersion.TLSv1_3


BAD = [
    ("tls: {}\n", "unknown key 'tls'"),
    ("tls_server_config:\n  cert_file: a.crt\n", "needs key_file"),
    ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     "cipher_suites is not supported"),
    ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  client_auth_type: RequireAnyClientCert\n"
     "  client_ca_file: ca.crt\n", "'RequireAnyClientCert' is not one gpulens can enforce"),
    ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  client_auth_type: RequireAndVerifyClientCert\n",
     "needs client_ca_file"),
    ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  min_version: SSL3\n", "min_version 'SSL3'"),
    ("basic_auth_users:\n  alice: plaintext\n", "is not a bcrypt hash"),
    ("basic_auth_users: [alice]\n", "must map user names"),
    ("http_server_config:\n  http2: false\n", "http_server_config"),
    ("tls_server_config: [\n", "is not valid YAML at line"),
    ("- a\n", "must be a YAML mapping"),
    # the second section of one key was used and the first dropped (a user locked out, a cert swapped)
    ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\ntls_server_config:\n  cert_file: b.crt\n",
     "the key 'tls_server_config' is given twice (lines 1 and 4)"),
]


@pytest.mark.parametrize(("text", "says"), BAD, ids=[b[1] for b in BAD])
def test_every_mistake_is_one_sentence_naming_it(tmp_path, text, says):
    with pytest.raises(BadInputError, match="^The web config ") as e:
        _load(tmp_path, text)
    assert says in str(e.value) and e.value.exit_code == 2


def test_a_certificate_that_does_not_load_is_one_sentence(tmp_path, certs):
    wc = _load(tmp_path, f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.client_key}\n")
    with pytest.raises(BadInputError, match="Cannot load the TLS certificate"):
        wc.ssl_context()
    wc = _load(tmp_path, f"tls_server_config:\n  cert_file: {tmp_path}/missing.crt\n  key_file: {certs.server_key}\n")
    with pytest.raises(BadInputError, match="No such file"):
        wc.ssl_context()


def test_basic_auth_checks_the_header():
    import_or_skip("bcrypt", "basic auth checks bcrypt hashes (the auth extra)")
    from gpulens.webconfig import BasicAuth

    auth = BasicAuth({"prom": bcrypt_hash("pw")})
    import base64

    def header(s: str) -> str:
        return "Basic " + base64.b64encode(s.encode()).decode()

    assert auth.check(header("prom:pw")) and auth.check(header("prom:pw"))
    assert not auth.check(header("prom:pW")) and not auth.check(header("other:pw"))
    assert not auth.check(None) and not auth.check("Bearer x") and not auth.check("Basic !!!") and not auth.check(header("prom"))


@pytest.mark.parametrize("command", ["agent", "dashboard"])
def test_the_commands_say_one_sentence_for_a_bad_file(tmp_path, command):
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: a.crt\n")
    (tmp_path / "s.db").touch()
    done = subprocess.run([sys.executable, "-m", "gpulens", command, "--store", str(tmp_path / "s.db"), "--listen", "127.0.0.1:0",
                           "--web-config", str(tmp_path / "web.yml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "tls_server_config needs key_file" in done.stderr


def test_without_bcrypt_the_message_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bcrypt", None)  # as if not installed
    with pytest.raises(BadInputError, match="needs the bcrypt package") as e:
        _load(tmp_path, "basic_auth_users:\n  p: '$2b$12$C3HQUloWo5uckHJekDWTaepohNtd7htlZlaxPtYD3grTuJ/sBlzNC'\n")
    assert "gpulens[auth]" in str(e.value) and e.value.exit_code == 2
