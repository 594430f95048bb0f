"""A private CA, one server and one client certificate, for the spec's ``tls`` (``gpufed certs``).

``make_certs`` is what ``gpufed certs ./certs --host child-region-0-0 --host '*.gpu.internal'``
and ``gpufed demo --tls`` run. It writes ``ca.crt``/``ca.key`` (kept when they are already
there, so running it again renews the leaves under the same CA), ``server.crt``/``server.key``
(valid for every ``--host`` plus ``localhost`` and ``127.0.0.1``: what the exporters, the
controller, the relay, the children, the master and the Alertmanagers serve) and
``client.crt``/``client.key`` (what Prometheus and Alertmanager present where client
certificates are required). Keys are written mode 0600; certificates replace the old ones
by rename, so a process re-reading them never sees half a file.

It shells out to ``openssl`` (``req``, ``x509``): ``cryptography`` is a test dependency
only, and every machine that runs a CA has ``openssl``. Elliptic-curve P-256 keys;
certificates carry SANs (Go ignores the common name), an authority key identifier
(Python 3.13's strict verification wants one) and the extended key usage of their role.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

DEFAULT_NAMES = ("localhost", "127.0.0.1")
KEY_ARGS = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


class CertsError(Exception):
    """openssl is missing or refused; the message names the step."""


def subject_alt_names(hosts: list[str]) -> str:
    """``subjectAltName`` for ``hosts`` (and localhost), IPs as ``IP:``, names as ``DNS:``."""
    entries: list[str] = []
    for host in [*hosts, *DEFAULT_NAMES]:
        try:
            entry = f"IP:{ipaddress.ip_address(host)}"
        except ValueError:
            if not host or any(c.isspace() or c in ",:/" for c in host):
                raise CertsError(f"--host {host!r} is not a host name or an IP address") from None
            entry = f"DNS:{host}"
        if entry not in entries:
            entries.append(entry)
    return ",".join(entries)


def _openssl(binary: str, args: list[str], *, step: str) -> None:
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CertsError(f"{step}: could not run {binary}: {exc}") from exc
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise CertsError(f"{step}: openssl failed: {last[0]}")


def _publish(staged: Path, final: Path, *, private: bool) -> None:
    if private:
        staged.chmod(0o600)
    os.replace(staged, final)


def make_ca(binary: str, out: Path, *, days: int, name: str) -> None:
    with tempfile.TemporaryDirectory(dir=out) as work_dir:
        work = Path(work_dir)
        _openssl(binary, ["req", "-x509", *KEY_ARGS, "-keyout", str(work / "ca.key"),
                          "-out", str(work / "ca.crt"), "-days", str(days), "-subj", f"/CN={name}",
                          "-addext", "basicConstraints=critical,CA:TRUE",
                          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], step="the CA")
        _publish(work / "ca.key", out / "ca.key", private=True)
        _publish(work / "ca.crt", out / "ca.crt", private=False)


def issue(binary: str, out: Path, *, stem: str, usage: str, common_name: str, sans: str, days: int) -> None:
    """``<stem>.crt``/``<stem>.key`` signed by ``out/ca.*``: key first, then the certificate."""
    extensions = "\n".join([
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
        f"subjectAltName={sans}",
        "subjectKeyIdentifier=hash",
        "authorityKeyIdentifier=keyid",
    ])
    with tempfile.TemporaryDirectory(dir=out) as work_dir:
        work = Path(work_dir)
        (work / "ext.cnf").write_text(extensions + "\n", encoding="utf-8")
        _openssl(binary, ["req", "-new", *KEY_ARGS, "-keyout", str(work / "leaf.key"),
                          "-out", str(work / "leaf.csr"), "-subj", f"/CN={common_name}"], step=stem)
        _openssl(binary, ["x509", "-req", "-in", str(work / "leaf.csr"), "-CA", str(out / "ca.crt"),
                          "-CAkey", str(out / "ca.key"), "-set_serial", f"0x{secrets.token_hex(16)}",
                          "-days", str(days), "-out", str(work / "leaf.crt"),
                          "-extfile", str(work / "ext.cnf")], step=stem)
        _publish(work / "leaf.key", out / f"{stem}.key", private=True)
        _publish(work / "leaf.crt", out / f"{stem}.crt", private=False)


def make_certs(out: Path, *, hosts: list[str], client_name: str, days: int, ca_days: int,
               openssl: str = "openssl") -> list[str]:
    """Write the CA (unless present) and both leaves into ``out``; the file names written."""
    binary = shutil.which(openssl)
    if binary is None:
        raise CertsError(f"{openssl!r} is not on PATH: gpufed certs runs openssl to sign")
    sans = subject_alt_names(hosts)
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    have_ca = (out / "ca.crt").is_file(), (out / "ca.key").is_file()
    if have_ca == (True, False) or have_ca == (False, True):
        raise CertsError(f"{out} has one of ca.crt and ca.key: both or neither")
    if not all(have_ca):
        make_ca(binary, out, days=ca_days, name="gpufed private CA")
        written += ["ca.crt", "ca.key"]
    issue(binary, out, stem="server", usage="serverAuth", common_name=hosts[0] if hosts else "localhost",
          sans=sans, days=days)
    issue(binary, out, stem="client", usage="clientAuth", common_name=client_name,
          sans=subject_alt_names([]), days=days)
    return [*written, "server.crt", "server.key", "client.crt", "client.key"]
