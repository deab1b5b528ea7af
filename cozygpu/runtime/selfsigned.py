"""A self-signed serving certificate made in memory, for an HTTPS server given no certificate files.

The ``/metrics`` server is HTTPS only; without ``--metrics-cert-dir`` it
serves a certificate it makes at start, as controller-runtime's secure
metrics serving does, so a local run works and a scraper that skips
verification (the chart's default ServiceMonitor) can read it.

Contract:
- ``self_signed_context(hosts)`` makes an ECDSA P-256 key and a certificate
  for ``hosts`` (DNS names and IP addresses), valid ``VALIDITY`` from a few
  minutes ago, and returns a server context (TLS 1.2 and later) holding them,
  with the certificate's PEM (what a test or a client that pins it trusts).
- Nothing is written to a file system: Python's ``ssl`` loads a key only from
  a path, so the PEM goes into an anonymous memory file (``memfd``) that is
  read through ``/proc/self/fd`` and closed at once; it works on the chart's
  read-only root file system.
- It is CPU work of a few milliseconds: call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from collections.abc import Sequence
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: A process lives far shorter than this; a new start makes a new certificate.
VALIDITY: Final = dt.timedelta(days=365)


def _general_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def self_signed_pem(hosts: Sequence[str], *, common_name: str = "cozygpu-metrics") -> tuple[bytes, bytes]:
    """A new certificate and its key, both PEM, for ``hosts``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def self_signed_context(hosts: Sequence[str]) -> tuple[ssl.SSLContext, bytes]:
    """A server context with a new self-signed certificate for ``hosts``, and that certificate's PEM."""
    cert_pem, key_pem = self_signed_pem(hosts)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    memory = os.memfd_create("cozygpu-serving-tls", os.MFD_CLOEXEC)
    try:
        os.write(memory, cert_pem + key_pem)
        context.load_cert_chain(f"/proc/self/fd/{memory}")
    finally:
        os.close(memory)
    return context, cert_pem
