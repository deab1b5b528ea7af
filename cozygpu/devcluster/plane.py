"""Start and stop etcd + kube-apiserver on loopback (the project's envtest).

``ControlPlane.start`` is blocking on purpose: it runs from the CLI and from
pytest's session set-up, never on an event loop. The processes run in their
own session so ``cozygpu cluster start`` can return and leave them running;
``state.json`` in the directory records what ``stop`` must end.

The API server runs with RBAC, admission webhooks and
ValidatingAdmissionPolicy (both default plugins), service-account token
signing, and a client CA from which ``identity()`` mints users. The
ServiceAccount admission plugin is off, as in envtest: no controller-manager
creates default service accounts here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from cozygpu.devcluster import binaries, pki
from cozygpu.kube import Client, resource_path

ADMIN_USER = "cozygpu-admin"
ADMIN_GROUPS = ("system:masters",)


class ControlPlaneError(RuntimeError):
    pass


class PortTaken(ControlPlaneError):
    """A port picked as free was taken by another process before etcd or the API server bound it."""


PORT_ATTEMPTS = 3


def _port_taken(logs: Path) -> bool:
    return any("address already in use" in log.read_text(errors="replace")
               for log in logs.glob("*.log"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@attrs.define
class ControlPlane:
    directory: Path
    minor: str
    kubernetes_version: str
    apiserver_port: int
    etcd_port: int
    etcd_pid: int
    apiserver_pid: int
    owns_directory: bool = False

    # -- paths ----------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def pki_dir(self) -> Path:
        return self.directory / "pki"

    @property
    def ca_file(self) -> Path:
        """The serving CA: trusts the API server and webhook servers it signs."""
        return self.pki_dir / "serving-ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        *,
        minor: str = binaries.DEFAULT_MINOR,
        directory: Path | None = None,
        build: bool = True,
        timeout: float = 60.0,
    ) -> ControlPlane:
        bins = binaries.ensure(minor) if build else binaries.find(minor)
        if bins is None:
            raise ControlPlaneError(
                f"control-plane binaries for Kubernetes {minor} are not built; "
                "run `python -m cozygpu.devcluster.binaries` (or `cozygpu cluster start`) first"
            )
        owns = directory is None
        root = Path(tempfile.mkdtemp(prefix=f"cozygpu-{minor}-")) if directory is None else directory
        root.mkdir(parents=True, exist_ok=True)
        if (root / "state.json").exists():
            raise ControlPlaneError(f"{root} already holds a control plane; stop it first (cozygpu cluster stop)")
        # New authorities on every start: identities minted by an earlier start are void.
        pki_dir = root / "pki"
        subprocess.run(["rm", "-rf", str(pki_dir)], check=False)
        pki_dir.mkdir()
        serving_ca = pki.make_ca(pki_dir, "serving-ca")
        pki.issue(serving_ca, pki_dir, "apiserver", common_name="kube-apiserver",
                  hosts=("127.0.0.1", "localhost"), server=True)
        pki.make_ca(pki_dir, "client-ca")
        pki.make_signing_key(pki_dir, "sa")
        (root / "logs").mkdir(exist_ok=True)

        # Free ports are picked by binding port 0 and closing it, which can race with
        # another process; a start that lost that race is retried on fresh ports.
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                plane = cls._launch(bins, root, minor=minor, owns=owns, timeout=timeout, fresh=attempt > 1)
            except PortTaken:
                if attempt == PORT_ATTEMPTS:
                    raise
                continue
            plane._write_kubeconfig()
            plane._save_state()
            return plane
        raise AssertionError("unreachable")

    @classmethod
    def _launch(cls, bins: binaries.Binaries, root: Path, *, minor: str, owns: bool, timeout: float,
                fresh: bool) -> ControlPlane:
        pki_dir, logs = root / "pki", root / "logs"
        serving = pki.KeyPair(pki_dir / "apiserver.crt", pki_dir / "apiserver.key")
        client_ca = pki.KeyPair(pki_dir / "client-ca.crt", pki_dir / "client-ca.key")
        sa_key = pki.KeyPair(pki_dir / "sa.pub", pki_dir / "sa.key")
        if fresh:  # what a start that lost the port race left behind
            subprocess.run(["rm", "-rf", str(root / "etcd")], check=False)
        etcd_port, peer_port = free_port(), free_port()
        etcd = _spawn(
            [
                str(bins.etcd), "--name=default", f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync=true", "--log-level=warn",
            ],
            logs / "etcd.log",
            truncate=True,
        )
        apiserver: subprocess.Popen[bytes] | None = None
        try:
            _wait_http(f"http://127.0.0.1:{etcd_port}/health", None, timeout, etcd, "etcd")
            port = free_port()
            apiserver = _spawn(
                [
                    str(bins.kube_apiserver),
                    f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                    "--bind-address=127.0.0.1", f"--secure-port={port}",
                    "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
                    f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
                    f"--client-ca-file={client_ca.cert}",
                    "--authorization-mode=RBAC",
                    f"--service-account-issuer=https://127.0.0.1:{port}",
                    f"--service-account-key-file={sa_key.cert}", f"--service-account-signing-key-file={sa_key.key}",
                    "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
                    "--disable-admission-plugins=ServiceAccount",
                    "--profiling=false",
                ],
                logs / "kube-apiserver.log",
                truncate=True,
            )
            plane = cls(
                directory=root, minor=minor, kubernetes_version=bins.kubernetes_version,
                apiserver_port=port, etcd_port=etcd_port, etcd_pid=etcd.pid, apiserver_pid=apiserver.pid,
                owns_directory=owns,
            )
            context = ssl.create_default_context(cafile=str(pki_dir / "serving-ca.crt"))
            _wait_http(f"{plane.host}/readyz", context, timeout, apiserver, "kube-apiserver")
            return plane
        except BaseException as err:
            for proc in (apiserver, etcd):
                if proc is not None:
                    terminate(proc.pid, 10)
            if isinstance(err, ControlPlaneError) and _port_taken(logs):
                raise PortTaken(str(err)) from err
            raise

    @classmethod
    def attach(cls, directory: Path) -> ControlPlane:
        """The control plane a previous ``start`` left running in ``directory``."""
        try:
            state = json.loads((directory / "state.json").read_text())
        except FileNotFoundError:
            raise ControlPlaneError(f"no control plane recorded in {directory}") from None
        return cls(directory=directory, **state)

    def stop(self, *, timeout: float = 15.0) -> None:
        """Stop the API server, then etcd; SIGKILL whatever outlives ``timeout``."""
        terminate(self.apiserver_pid, timeout, expect="kube-apiserver")
        terminate(self.etcd_pid, timeout, expect="etcd")
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "state.json").unlink()
        if self.owns_directory:
            subprocess.run(["rm", "-rf", str(self.directory)], check=False)

    def alive(self) -> bool:
        return _alive(self.apiserver_pid, "kube-apiserver") and _alive(self.etcd_pid, "etcd")

    def _save_state(self) -> None:
        state = attrs.asdict(self)
        state.pop("directory")
        (self.directory / "state.json").write_text(json.dumps(state, indent=2))

    def _write_kubeconfig(self) -> None:
        admin = self.identity(ADMIN_USER, ADMIN_GROUPS)
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_for(admin, name="cozygpu-local")))
        self.kubeconfig.chmod(0o600)

    def kubeconfig_for(self, identity: pki.KeyPair, *, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.host, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": name, "user": {"client-certificate": str(identity.cert),
                                              "client-key": str(identity.key)}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }

    # -- identities -----------------------------------------------------------------------

    def identity(self, user: str, groups: Sequence[str] = ()) -> pki.KeyPair:
        """A client certificate for ``user`` in ``groups`` (minted once, then reused)."""
        slug = "-".join([user, *groups]).replace(":", "_").replace("/", "_")
        pair = pki.KeyPair(self.pki_dir / f"user-{slug}.crt", self.pki_dir / f"user-{slug}.key")
        if not pair.cert.exists():
            ca = pki.KeyPair(self.pki_dir / "client-ca.crt", self.pki_dir / "client-ca.key")
            pair = pki.issue(ca, self.pki_dir, f"user-{slug}", common_name=user, organizations=groups)
        return pair

    def ssl_context(self, identity: pki.KeyPair | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if identity is not None:
            context.load_cert_chain(str(identity.cert), str(identity.key))
        return context

    def client(self, user: str = ADMIN_USER, groups: Sequence[str] = ADMIN_GROUPS) -> Client:
        """A client acting as ``user`` in ``groups`` through a client certificate."""
        return Client(self.host, ssl_context=self.ssl_context(self.identity(user, groups)))

    def token_client(self, token: str) -> Client:
        return Client(self.host, ssl_context=self.ssl_context(), token=token)

    async def service_account_token(
        self, admin: Client, *, namespace: str, service_account: str, node_name: str | None = None,
        expiration_seconds: int = 3600,
    ) -> str:
        """A token for ``service_account``; with ``node_name``, bound to a Pod on that node.

        A pod-bound token's user carries the extras
        ``authentication.kubernetes.io/pod-name`` and ``.../node-name``, which
        is what the agent policy (R-POL-2) compares with the GPUNode name. The
        Pod stays Pending forever (no kubelet), which is all a binding needs.
        """
        sa_path = resource_path("", "v1", "serviceaccounts", namespace=namespace)
        if await admin.get_or_none(f"{sa_path}/{service_account}") is None:
            await admin.create(sa_path, {"metadata": {"name": service_account}})
        request: dict[str, Any] = {"spec": {"expirationSeconds": expiration_seconds}}
        if node_name is not None:
            pod = await admin.create(
                resource_path("", "v1", "pods", namespace=namespace),
                {
                    "metadata": {"generateName": f"{service_account}-"},
                    "spec": {
                        "serviceAccountName": service_account,
                        "nodeName": node_name,
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "agent", "image": "cozygpu.invalid/agent"}],
                    },
                },
            )
            request["spec"]["boundObjectRef"] = {
                "apiVersion": "v1", "kind": "Pod",
                "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"],
            }
        answer = await admin.create(f"{sa_path}/{service_account}/token", request)
        token: str = answer["status"]["token"]
        return token


def _spawn(argv: list[str], log: Path, *, truncate: bool = False) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env["no_proxy"] = env["NO_PROXY"]
    with log.open("wb" if truncate else "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def _wait_http(url: str, context: ssl.SSLContext | None, timeout: float,
               proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ControlPlaneError(f"{what} exited with code {proc.returncode} before it was ready; see its log")
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as err:
            last = str(err)
        time.sleep(0.1)
    raise ControlPlaneError(f"{what} was not ready within {timeout:.0f} s ({url}: {last})")


def _alive(pid: int, expect: str | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not), and, with ``expect``, is still that program.

    ``expect`` guards pids read back from a state file: after a reboot or once
    the pid is reused, it names somebody else's process, which must not be signalled.
    """
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        return False
    return expect is None or expect in command


def terminate(pid: int, timeout: float, *, expect: str | None = None) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; nothing when ``pid`` is gone or (``expect``) not that program."""
    if not _alive(pid, expect):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.05)
