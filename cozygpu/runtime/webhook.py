"""The admission webhook server's slot: HTTPS on ``--webhook-addr`` with the certificate in ``--cert-dir``.

Started only with ``--enable-gpu``, after the caches the webhooks read have
synced and before leader election (R-RUN-2). It serves no admission handler
yet: the GPUDevice, VMI and launcher-pod webhooks join in later issues by
adding routes to ``app``; until then every path answers 404, which the API
server treats as a failed call (the webhooks fail closed, R-ADM-6).

The certificate is ``tls.crt`` and ``tls.key`` as cert-manager and Secret
volumes write them. It is read off the event loop, and re-read when either
file changes (cert-manager rotates it in place): each TLS handshake picks the
newest certificate through the SNI callback, so no listener restarts.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path
from typing import Final

from aiohttp import web

from cozygpu.admission.envelope import MAX_BODY
from cozygpu.base.logging import get_logger

_log = get_logger("cozygpu.webhook")

CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"


def webhook_app() -> web.Application:
    """The webhook application: routes are added by ``AdmissionWebhooks.install``.

    The body limit is the envelope's (it reads the body itself and answers 400 past it).
    """
    return web.Application(client_max_size=MAX_BODY)


def _server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class ServingCertificate:
    """The webhook server's TLS context, following the files in ``cert_dir``."""

    def __init__(self, cert_dir: Path) -> None:
        self.cert = cert_dir / CERT_FILE
        self.key = cert_dir / KEY_FILE
        self._current: ssl.SSLContext | None = None
        self._stamp: tuple[float, float] | None = None

    def _stat(self) -> tuple[float, float]:
        return (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)

    async def load(self) -> ssl.SSLContext:
        """Read the certificate (in a thread) and return the context to listen with."""
        self._stamp = await asyncio.to_thread(self._stat)
        listening = await asyncio.to_thread(_server_context, self.cert, self.key)
        listening.sni_callback = self._pick
        self._current = listening
        return listening

    def _pick(self, connection: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        if self._current is not None and connection.context is not self._current:
            connection.context = self._current

    async def follow(self, interval: float = 10.0) -> None:
        """Re-read the certificate whenever its files change, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                stamp = await asyncio.to_thread(self._stat)
                if stamp == self._stamp:
                    continue
                self._current = await asyncio.to_thread(_server_context, self.cert, self.key)
                self._stamp = stamp
                _log.info("reloaded the webhook serving certificate", cert=str(self.cert))
            except (OSError, ssl.SSLError) as err:
                # Mid-rotation the two files may disagree for a moment; keep serving the old pair.
                _log.warning("could not reload the webhook serving certificate", error=str(err))
