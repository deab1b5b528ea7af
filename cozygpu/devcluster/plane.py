"""Start and stop a local control plane on loopback (the project's envtest).

Two shapes: the *fast* plane is etcd + kube-apiserver (what the CRD, policy
and cache tests need); the *full* plane adds kube-controller-manager,
kube-scheduler and kwok, which keeps the simulated GPU nodes (Nodes carrying
the annotation ``SIMULATED_NODE``) Ready with lease heartbeats and runs the
pods bound to them. Scheduling, namespace deletion, garbage collection and
node lifecycle are then the real thing, and so is Dynamic Resource Allocation
(GA since 1.34, on by default): kube-scheduler allocates ResourceClaims from the
ResourceSlices a driver publishes (``dra_driver`` publishes them for simulated
nodes), and the resourceclaim controller makes claims from templates and drops
deleted pods from ``status.reservedFor``.

``ControlPlane.start`` is blocking on purpose: it runs from the CLI and from
pytest's session set-up, never on an event loop. The processes run in their
own session so ``cozygpu cluster start`` can return and leave them running;
``state.json`` in the directory records what ``stop`` must end.
``restart_apiserver`` stops the API server and starts it again on the same
port, etcd and certificates (a fault the chaos test injects).

The API server runs with RBAC, admission webhooks and
ValidatingAdmissionPolicy (both default plugins), service-account token
signing, and a client CA from which ``identity()`` mints users. The
ServiceAccount admission plugin is off, as in envtest, on both shapes: pods
need no ``default`` service account, so a test may create one right after its
namespace (kwok runs no containers, so nothing mounts a token).

The controller-manager and the scheduler act as their own users
(``system:kube-controller-manager`` with per-controller service-account
credentials, ``system:kube-scheduler``) under the bootstrap RBAC roles, as in
a kubeadm cluster. The node-lifecycle controller runs with short grace
periods so a node whose heartbeats stop goes NotReady, and is tainted
unreachable, within seconds: kwok renews each node's Lease every quarter of
``node_lease_seconds`` and the controller waits as long as one Lease lasts.
The cost is one Lease write per node per renewal (1,000 nodes at the default
20 s: 200 writes/s); a benchmark that needs the CPU passes a longer lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
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

from cozygpu.devcluster import binaries, kwok_stages, pki
from cozygpu.kube import Client, resource_path

ADMIN_USER = "cozygpu-admin"
ADMIN_GROUPS = ("system:masters",)

#: The annotation kwok selects the nodes it manages by; nothing else is touched.
SIMULATED_NODE = "devcluster.gpu.cozystack.io/simulated"
#: kube-controller-manager's controllers on the full plane (the rest stay off to save CPU).
CONTROLLERS = (
    "namespace-controller", "garbage-collector-controller", "node-lifecycle-controller",
    "taint-eviction-controller", "serviceaccount-controller", "serviceaccount-token-controller",
    "pod-garbage-collector-controller", "resourcequota-controller", "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller", "resourceclaim-controller",
)
#: Node heartbeats: kwok renews each node's Lease every quarter of this; the node-lifecycle
#: controller calls a node NotReady after as long without a renewal.
NODE_LEASE_SECONDS = 20
#: How often the node-lifecycle controller looks at every node (``--node-monitor-period``), in seconds.
NODE_MONITOR_PERIOD = 1


class ControlPlaneError(RuntimeError):
    pass


class PortTaken(ControlPlaneError):
    """A port picked as free was taken by another process before etcd or the API server bound it."""


PORT_ATTEMPTS = 3


def _port_taken(logs: Path) -> bool:
    return any("address already in use" in log.read_text(errors="replace")
               for log in logs.glob("*.log"))


#: Listening ports are picked below the kernel's ephemeral range (from here up), where no outgoing
#: connection takes one between the pick and the component's bind (seen: kube-scheduler refused
#: to start on a port an API server connection had just been given).
LISTEN_PORTS_FROM = 20000


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A loopback TCP port nobody listens on now, below the ephemeral range when the kernel says where."""
    low, high = LISTEN_PORTS_FROM, _ephemeral_start()
    for _ in range(50 if high > low + 100 else 0):
        port = random.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


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
    #: The full plane's components, in start order: name -> (pid, health URL).
    components: dict[str, tuple[int, str]] = attrs.field(factory=dict)

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
        full: bool = False,
        node_lease_seconds: int = NODE_LEASE_SECONDS,
        timeout: float = 60.0,
    ) -> ControlPlane:
        """Start the fast plane, or with ``full`` the whole plane; returns once every part is healthy."""
        bins = binaries.ensure(minor, full=full) if build else binaries.find(minor)
        if bins is None or (full and not bins.full):
            what = "full control plane" if full else "control plane"
            raise ControlPlaneError(
                f"{what} binaries for Kubernetes {minor} are not built; "
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

        # A free port is picked by binding it and closing it (``free_port``), which can race with
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
            if full:
                try:
                    plane._start_components(bins, timeout=timeout, node_lease_seconds=node_lease_seconds)
                except BaseException:
                    plane.stop()
                    raise
                plane._save_state()
            return plane
        raise AssertionError("unreachable")

    def _start_components(self, bins: binaries.Binaries, *, timeout: float, node_lease_seconds: int) -> None:
        """kube-controller-manager, kube-scheduler and kwok, each as its own user, started together."""
        if bins.kube_controller_manager is None or bins.kube_scheduler is None or bins.kwok is None:
            raise ControlPlaneError("the full plane needs kube-controller-manager, kube-scheduler and kwok built")
        logs, pki_dir = self.directory / "logs", self.pki_dir
        kcm_port, scheduler_port, kwok_port = free_port(), free_port(), free_port()
        kcm = self._component_kubeconfig("kube-controller-manager", "system:kube-controller-manager")
        scheduler = self._component_kubeconfig("kube-scheduler", "system:kube-scheduler")
        kwok = self._component_kubeconfig("kwok", ADMIN_USER, ADMIN_GROUPS)
        stages = self.directory / "kwok.yaml"
        stages.write_text(kwok_stages.CONFIG)
        allow = "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
        specs: list[tuple[str, list[str], str]] = [
            ("kube-controller-manager", [
                str(bins.kube_controller_manager), f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}", f"--authorization-kubeconfig={kcm}", allow,
                "--bind-address=127.0.0.1", f"--secure-port={kcm_port}", f"--cert-dir={self.directory / 'kcm'}",
                "--leader-elect=false", "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki_dir / 'sa.key'}", f"--root-ca-file={self.ca_file}",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--node-monitor-grace-period={node_lease_seconds}s", f"--node-monitor-period={NODE_MONITOR_PERIOD}s",
                "--node-startup-grace-period=20s", "--concurrent-gc-syncs=5",
                "--kube-api-qps=200", "--kube-api-burst=400", "--profiling=false",
            ], f"https://127.0.0.1:{kcm_port}/healthz"),
            ("kube-scheduler", [
                str(bins.kube_scheduler), f"--kubeconfig={scheduler}",
                f"--authentication-kubeconfig={scheduler}", f"--authorization-kubeconfig={scheduler}", allow,
                "--bind-address=127.0.0.1", f"--secure-port={scheduler_port}",
                f"--cert-dir={self.directory / 'scheduler'}", "--leader-elect=false", "--profiling=false",
            ], f"https://127.0.0.1:{scheduler_port}/healthz"),
            ("kwok", [
                str(bins.kwok), f"--kubeconfig={kwok}", f"--config={stages}", "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={SIMULATED_NODE}=true",
                f"--node-lease-duration-seconds={node_lease_seconds}",
                f"--server-address=127.0.0.1:{kwok_port}", "--cidr=10.244.0.1/16", "--node-ip=127.0.0.1", "--v=WARN",
            ], f"http://127.0.0.1:{kwok_port}/healthz"),
        ]
        procs = []
        for name, argv, health in specs:
            proc = _spawn(argv, logs / f"{name}.log", truncate=True)
            self.components[name] = (proc.pid, health)
            procs.append((name, proc, health))
        self._save_state()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their serving certificates are self-signed, made at start
        for name, proc, health in procs:
            try:
                _wait_http(health, insecure if health.startswith("https") else None, timeout, proc, name)
            except ControlPlaneError as err:
                raise ControlPlaneError(f"{err}\n{_tail(logs / f'{name}.log')}") from None

    def _component_kubeconfig(self, name: str, user: str, groups: Sequence[str] = ()) -> Path:
        path = self.directory / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(self.kubeconfig_for(self.identity(user, groups), name=name)))
        path.chmod(0o600)
        return path

    @property
    def full(self) -> bool:
        return bool(self.components)

    def dead(self) -> dict[str, str]:
        """Each process of this plane that is not running, with the tail of its log."""
        names = {"etcd": self.etcd_pid, "kube-apiserver": self.apiserver_pid}
        names.update({name: pid for name, (pid, _) in self.components.items()})
        return {name: _tail(self.directory / "logs" / f"{name}.log")
                for name, pid in names.items() if not alive(pid, name)}

    def check(self) -> None:
        """Raise with the tails of their logs when any process of this plane has died."""
        if dead := self.dead():
            raise ControlPlaneError("control-plane processes died: " + "; ".join(
                f"{name} (log tail:\n{tail})" for name, tail in dead.items()))

    def health(self) -> list[tuple[str, int, str]]:
        """(name, pid, state) of every process: ``ok``, ``unhealthy: ...`` or ``not running``."""
        rows: list[tuple[str, int, str]] = []
        context = self.ssl_context(self.identity(ADMIN_USER, ADMIN_GROUPS))
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        probes = [("etcd", self.etcd_pid, f"http://127.0.0.1:{self.etcd_port}/health", None),
                  ("kube-apiserver", self.apiserver_pid, f"{self.host}/readyz", context)]
        probes += [(name, pid, url, insecure if url.startswith("https") else None)
                   for name, (pid, url) in self.components.items()]
        for name, pid, url, ctx in probes:
            if not alive(pid, name):
                rows.append((name, pid, "not running"))
                continue
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
                    rows.append((name, pid, "ok" if resp.status == 200 else f"unhealthy: HTTP {resp.status}"))
            except (urllib.error.URLError, OSError) as err:
                rows.append((name, pid, f"unhealthy: {err}"))
        return rows

    @classmethod
    def _launch(cls, bins: binaries.Binaries, root: Path, *, minor: str, owns: bool, timeout: float,
                fresh: bool) -> ControlPlane:
        pki_dir, logs = root / "pki", root / "logs"
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
            apiserver = _spawn(_apiserver_argv(bins, pki_dir, etcd_port, port), logs / "kube-apiserver.log",
                               truncate=True)
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

    def restart_apiserver(self, *, timeout: float = 60.0) -> None:
        """Stop the API server (SIGTERM) and start it again: same port, etcd and certificates; returns once ready.

        What an operator's restart (or an upgrade in place) does to every client: open
        connections and watches end, requests are refused until it is back, and then
        everything etcd holds is served again. Components and identities are kept.
        """
        bins = binaries.find(self.minor)
        if bins is None:
            raise ControlPlaneError(f"control plane binaries for Kubernetes {self.minor} are not built")
        terminate(self.apiserver_pid, timeout, expect="kube-apiserver")
        log = self.directory / "logs" / "kube-apiserver.log"
        apiserver = _spawn(_apiserver_argv(bins, self.pki_dir, self.etcd_port, self.apiserver_port), log)
        self.apiserver_pid = apiserver.pid
        self._save_state()
        try:
            _wait_http(f"{self.host}/readyz", self.ssl_context(), timeout, apiserver, "kube-apiserver")
        except ControlPlaneError as err:
            raise ControlPlaneError(f"{err}\n{_tail(log)}") from None

    @classmethod
    def attach(cls, directory: Path) -> ControlPlane:
        """The control plane a previous ``start`` left running in ``directory``."""
        try:
            state = json.loads((directory / "state.json").read_text())
        except FileNotFoundError:
            raise ControlPlaneError(f"no control plane recorded in {directory}") from None
        state["components"] = {name: (pid, url) for name, (pid, url) in state.get("components", {}).items()}
        return cls(directory=directory, **state)

    def stop(self, *, timeout: float = 15.0) -> None:
        """Stop the components in reverse order, the API server, then etcd; SIGKILL what outlives ``timeout``."""
        for name, (pid, _) in reversed(list(self.components.items())):
            terminate(pid, timeout, expect=name)
        terminate(self.apiserver_pid, timeout, expect="kube-apiserver")
        terminate(self.etcd_pid, timeout, expect="etcd")
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "state.json").unlink()
        if self.owns_directory:
            subprocess.run(["rm", "-rf", str(self.directory)], check=False)

    def alive(self) -> bool:
        return not self.dead()

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


def _apiserver_argv(bins: binaries.Binaries, pki_dir: Path, etcd_port: int, port: int) -> list[str]:
    serving = pki.KeyPair(pki_dir / "apiserver.crt", pki_dir / "apiserver.key")
    client_ca = pki.KeyPair(pki_dir / "client-ca.crt", pki_dir / "client-ca.key")
    sa_key = pki.KeyPair(pki_dir / "sa.pub", pki_dir / "sa.key")
    return [
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
        # Open watches are ended at shutdown after this grace: without it a stop or a restart waits out the
        # 60 s shutdown timeout for every HTTP/1.1 watch a client holds open.
        "--shutdown-watch-termination-grace-period=1s",
    ]


def _spawn(argv: list[str], log: Path, *, truncate: bool = False) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env["no_proxy"] = env["NO_PROXY"]
    with log.open("wb" if truncate else "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {log})"


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


def alive(pid: int, expect: str | None = None) -> bool:
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
    if not alive(pid, expect):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.05)
