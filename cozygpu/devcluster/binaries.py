"""Build and cache the control-plane binaries from the Go module proxy.

No registry reachable from here serves prebuilt Kubernetes binaries, so the
project builds pinned releases with the machine's Go toolchain:

- kube-apiserver (and kubectl, for people) from a throwaway *wrapper module*
  that requires ``k8s.io/kubernetes`` and replaces every ``k8s.io/*`` staging
  module with its published ``v0.<minor>.<patch>`` (``go install pkg@v``
  refuses modules whose go.mod carries ``replace`` lines). The staging list is
  read from the published go.mod, never hard-coded.
- etcd from its own wrapper (so minimal version selection cannot pull the
  apiserver's dependencies forward).
- helm and kwok with ``go install`` (their go.mod files have no replace
  lines). kwok is the Kubernetes project's node simulator: it keeps the
  simulated GPU nodes Ready and runs the pods bound to them.
- kube-scheduler and kube-controller-manager from the same wrapper module as
  kube-apiserver, for the full local plane.
- prometheus and promtool with one ``go install`` of the Prometheus module
  (its go.mod has no replace lines), with only the file and HTTP service
  discoveries (``remove_all_sd``) and no web UI assets: the local plane needs
  the HTTP API, the chart's rule tests need promtool.

Binaries land in ``$COZYGPU_CACHE`` (default ``~/.cache/cozygpu``) under
``bin/<name>-<version>/``; a binary that exists there is reused, so only the
first run on a machine pays for the build. Nothing here runs on an event loop:
it is called from the CLI and from pytest's session set-up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

#: The current Kubernetes minor and the oldest one Cozystack supports.
KUBERNETES: dict[str, str] = {"1.37": "v1.37.2", "1.33": "v1.33.13"}
DEFAULT_MINOR = "1.37"
#: Every supported minor, newest first (tests marked ``both_minors`` run on each).
MINORS: tuple[str, ...] = tuple(sorted(KUBERNETES, key=lambda m: tuple(map(int, m.split("."))), reverse=True))
#: etcd recommended for these releases (kubeadm pairs them with 3.6.x).
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v4.3.2"
KWOK_VERSION = "v0.8.0"
#: Prometheus 3.16.0: the Go module numbers Prometheus 3.x releases v0.3xx.y.
PROMETHEUS_VERSION = "v0.316.0"
PROMETHEUS_RELEASE = "3.16.0"
#: What the fast plane runs; the full plane adds FULL_PLANE.
API_SERVER = "kube-apiserver"
FULL_PLANE = ("kube-scheduler", "kube-controller-manager")


def cache_dir() -> Path:
    root = os.environ.get("COZYGPU_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "cozygpu"


@attrs.frozen
class Binaries:
    """Paths of one control plane's binaries."""

    kube_apiserver: Path
    etcd: Path
    kubectl: Path | None
    kubernetes_version: str
    #: Set when the full plane's binaries are cached too.
    kube_scheduler: Path | None = None
    kube_controller_manager: Path | None = None
    kwok: Path | None = None

    @property
    def full(self) -> bool:
        return None not in (self.kube_scheduler, self.kube_controller_manager, self.kwok)


class BuildError(RuntimeError):
    pass


def _log(message: str) -> None:
    print(f"[cozygpu build] {message}", file=sys.stderr, flush=True)


def _go(args: Sequence[str], *, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        ["go", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BuildError(f"go {' '.join(args)} failed in {cwd}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def _go_env() -> dict[str, str]:
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain (go 1.26) is needed to build the control plane")
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
    return env


def _staging_modules(gomod_text: str) -> list[str]:
    """The ``k8s.io/*`` modules k8s.io/kubernetes maps to ./staging/src."""
    return sorted(
        set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/", gomod_text, re.M))
    )


def _version_ldflags(version: str) -> str:
    major, minor, _ = version.lstrip("v").split(".", 2)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitCommit": f"module-{version}",
        "gitTreeState": "clean",
        "buildDate": stamp,
    }
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in values.items()]
    return " ".join(flags)


def _installed(target: Path) -> bool:
    return target.is_file() and os.access(target, os.X_OK)


def _build_kubernetes(version: str, commands: Sequence[str], out: Path) -> None:
    env = _go_env()
    minor = version.lstrip("v").split(".")[1]
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    with tempfile.TemporaryDirectory(prefix=f"k8s-{version}-", dir=_work_root()) as tmp:
        wd = Path(tmp)
        _go(["mod", "init", "example.invalid/k8sbin"], cwd=wd, env=env)
        _go(["mod", "edit", "-go=1.26.0", f"-godebug=default=go1.{min(int(minor), 26)}"], cwd=wd, env=env)
        info = json.loads(_go(["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], cwd=wd, env=env))
        staging = _staging_modules(Path(info["GoMod"]).read_text())
        if not staging:
            raise BuildError(f"no staging replace block in k8s.io/kubernetes@{version}'s go.mod")
        _go(["mod", "edit", *[f"-replace={m}={m}@{staging_version}" for m in staging]], cwd=wd, env=env)
        _log(f"kubernetes {version}: resolving modules ({len(staging)} staging modules)")
        for command in commands:
            _go(["get", "-tool", f"k8s.io/kubernetes/cmd/{command}@{version}"], cwd=wd, env=env)
        _go(["mod", "tidy"], cwd=wd, env=env)
        ldflags = "-s -w " + _version_ldflags(version)
        for command in commands:
            _log(f"kubernetes {version}: compiling {command} (a cold build takes minutes)")
            started = time.monotonic()
            _go(
                ["build", "-trimpath", "-tags", "selinux,notest,grpcnotrace",
                 "-ldflags", ldflags, "-o", str(wd / command), f"k8s.io/kubernetes/cmd/{command}"],
                cwd=wd, env=env,
            )
            _install(wd / command, out / command)
            _log(f"kubernetes {version}: {command} built in {time.monotonic() - started:.0f} s")


def _build_etcd(version: str, out: Path) -> None:
    env = _go_env()
    with tempfile.TemporaryDirectory(prefix=f"etcd-{version}-", dir=_work_root()) as tmp:
        wd = Path(tmp)
        _go(["mod", "init", "example.invalid/etcdbin"], cwd=wd, env=env)
        _go(["mod", "edit", "-go=1.26.0"], cwd=wd, env=env)
        _go(["get", "-tool", f"go.etcd.io/etcd/server/v3@{version}"], cwd=wd, env=env)
        _go(["mod", "tidy"], cwd=wd, env=env)
        _log(f"etcd {version}: compiling")
        started = time.monotonic()
        _go(
            ["build", "-trimpath", "-ldflags",
             f"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA={version}",
             "-o", str(wd / "etcd"), "go.etcd.io/etcd/server/v3"],
            cwd=wd, env=env,
        )
        _install(wd / "etcd", out / "etcd")
        _log(f"etcd {version}: built in {time.monotonic() - started:.0f} s")


def _go_install(packages: Sequence[str], version: str, out: Path, *, tags: Sequence[str] = (),
                ldflags: str = "") -> None:
    """``go install package@version ...`` (one module, one version) for a module without replace lines."""
    env = _go_env()
    names = [package.rsplit("/", 1)[-1] for package in packages]
    with tempfile.TemporaryDirectory(prefix=f"{names[0]}-{version}-", dir=_work_root()) as tmp:
        env["GOBIN"] = tmp
        _log(f"{' and '.join(names)} {version}: compiling")
        started = time.monotonic()
        flags = ["-trimpath", f"-ldflags=-s -w {ldflags}".rstrip(), *(["-tags", ",".join(tags)] if tags else [])]
        _go(["install", *flags, *(f"{package}@{version}" for package in packages)], cwd=Path(tmp), env=env)
        for name in names:
            _install(Path(tmp) / name, out / name)
        _log(f"{' and '.join(names)} {version}: built in {time.monotonic() - started:.0f} s")


def _work_root() -> Path:
    root = cache_dir() / "build"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _install(built: Path, target: Path) -> None:
    """Move a finished binary into the cache atomically (a killed build leaves none)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copy2(built, partial)
    partial.chmod(0o755)
    partial.replace(target)


def kubernetes_version(minor: str) -> str:
    try:
        return KUBERNETES[minor]
    except KeyError:
        raise BuildError(f"unsupported Kubernetes minor {minor!r}; pinned: {', '.join(sorted(KUBERNETES))}") from None


def _kube_dir(version: str) -> Path:
    return cache_dir() / "bin" / f"kubernetes-{version}"


def _etcd_path() -> Path:
    return cache_dir() / "bin" / f"etcd-{ETCD_VERSION}" / "etcd"


def _kwok_path() -> Path:
    return cache_dir() / "bin" / f"kwok-{KWOK_VERSION}" / "kwok"


def ensure(minor: str = DEFAULT_MINOR, *, with_kubectl: bool = False, full: bool = False) -> Binaries:
    """Return the binaries for ``minor``, building whatever is missing.

    ``full`` adds kube-scheduler, kube-controller-manager and kwok.
    """
    version = kubernetes_version(minor)
    kube_dir = _kube_dir(version)
    wanted = [API_SERVER, *(["kubectl"] if with_kubectl else []), *(FULL_PLANE if full else ())]
    missing = [c for c in wanted if not _installed(kube_dir / c)]
    if missing:
        _build_kubernetes(version, missing, kube_dir)
    if not _installed(_etcd_path()):
        _build_etcd(ETCD_VERSION, _etcd_path().parent)
    if full and not _installed(_kwok_path()):
        _go_install(["sigs.k8s.io/kwok/cmd/kwok"], KWOK_VERSION, _kwok_path().parent)
    found = find(minor)
    if found is None or (full and not found.full):
        raise BuildError(f"the binaries for Kubernetes {minor} were built but are not in {cache_dir()}")
    return found


def find(minor: str = DEFAULT_MINOR) -> Binaries | None:
    """The cached binaries for ``minor``, or None when the API server or etcd is missing.

    Builds nothing; the full plane's binaries are set only where cached.
    """
    version = kubernetes_version(minor)
    kube_dir = _kube_dir(version)
    kube, etcd = kube_dir / API_SERVER, _etcd_path()
    if not (_installed(kube) and _installed(etcd)):
        return None

    def cached(path: Path) -> Path | None:
        return path if _installed(path) else None

    return Binaries(
        kube, etcd, cached(kube_dir / "kubectl"), version,
        kube_scheduler=cached(kube_dir / "kube-scheduler"),
        kube_controller_manager=cached(kube_dir / "kube-controller-manager"),
        kwok=cached(_kwok_path()),
    )


def ensure_helm() -> Path:
    target = cache_dir() / "bin" / f"helm-{HELM_VERSION}" / "helm"
    if not _installed(target):
        _go_install(["helm.sh/helm/v4/cmd/helm"], HELM_VERSION, target.parent)
    return target


@attrs.frozen
class PrometheusBinaries:
    prometheus: Path
    promtool: Path


def _prometheus_dir() -> Path:
    return cache_dir() / "bin" / f"prometheus-{PROMETHEUS_VERSION}"


def find_prometheus() -> PrometheusBinaries | None:
    """The cached prometheus and promtool, or None when either is missing (builds nothing)."""
    found = PrometheusBinaries(_prometheus_dir() / "prometheus", _prometheus_dir() / "promtool")
    return found if _installed(found.prometheus) and _installed(found.promtool) else None


def ensure_prometheus() -> PrometheusBinaries:
    """prometheus and promtool, built together when either is missing."""
    if (found := find_prometheus()) is not None:
        return found
    stamp = " ".join(f"-X github.com/prometheus/common/version.{key}={value}" for key, value in {
        "Version": PROMETHEUS_RELEASE, "Revision": f"module-{PROMETHEUS_VERSION}", "Branch": "release"}.items())
    _go_install([f"github.com/prometheus/prometheus/cmd/{name}" for name in ("prometheus", "promtool")],
                PROMETHEUS_VERSION, _prometheus_dir(), tags=("remove_all_sd",), ldflags=stamp)
    if (found := find_prometheus()) is None:
        raise BuildError(f"prometheus and promtool were built but are not in {_prometheus_dir()}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cozygpu.devcluster.binaries [MINOR ...]``: build everything pinned."""
    minors = list(argv if argv is not None else sys.argv[1:]) or sorted(KUBERNETES, reverse=True)
    started = time.monotonic()
    try:
        for minor in minors:
            b = ensure(minor, with_kubectl=minor == DEFAULT_MINOR, full=minor == DEFAULT_MINOR)
            _log(f"{minor}: {b.kube_apiserver} ({b.kube_apiserver.stat().st_size / 1e6:.0f} MB)")
        helm = ensure_helm()
        _log(f"helm: {helm}")
        prometheus = ensure_prometheus()
        _log(f"prometheus and promtool: {prometheus.prometheus.parent}")
    except BuildError as err:
        _log(str(err))
        return 1
    _log(f"all binaries ready in {time.monotonic() - started:.0f} s under {cache_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
