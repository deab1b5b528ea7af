"""Kubeconfig loading that fails with one sentence a person can act on, never a library traceback.

Why: kubernetes-asyncio raises its own ``ConfigException`` (and, for a file
that is not YAML, a yaml error; for an empty one, a ``TypeError``) with
messages such as "Invalid kube-config file. Expected key current-context in
kube-config". A new user running ``cozygpu catalog`` should read instead
which file was read and what is wrong with it.

Contract:
- Which files: the ``path`` given, else every entry of ``$KUBECONFIG`` (read
  when called, not at import), else ``~/.kube/config``. As kubectl does,
  entries of ``$KUBECONFIG`` that do not exist are skipped, empty ones add
  nothing, and clusters, contexts and users merge with the first definition
  of a name winning; the first file that sets ``current-context`` wins.
- Before the library sees the merged config it is checked: the file exists,
  is not empty, is YAML, is a mapping; there is a context to use, it
  exists, its cluster exists and has a server. Each failure is a
  :class:`~cozygpu.kube.errors.ConfigError` naming the file and the fix.
  Anything the library still refuses (a missing certificate file, a failing
  exec plugin) becomes a ``ConfigError`` with its message on one line.
- Relative file references (a cluster's ``certificate-authority``, a user's
  ``client-certificate``, ``client-key`` and ``tokenFile``) are resolved
  against the directory of the file that names them, as kubectl does.
- Files are read in a worker thread; the library's ``load_and_set`` (which
  may run an exec credential plugin) runs on the loop as before.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import attrs
import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.kube_config import ConfigNode, KubeConfigLoader

from cozygpu.kube.errors import ConfigError

DEFAULT_PATH = "~/.kube/config"
_LISTS = ("clusters", "contexts", "users")
#: Per list: the body key and its fields that name files.
_FILE_FIELDS = {"clusters": ("cluster", ("certificate-authority",)),
                "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


@attrs.frozen
class Source:
    """Where the configuration comes from, as a person would name it."""

    paths: tuple[str, ...]
    origin: str

    def describe(self) -> str:
        shown = ", ".join(self.paths)
        return f"kubeconfig {shown}" + (f" ({self.origin})" if self.origin else "")


def source_for(path: str | None, environ: Mapping[str, str] | None = None) -> Source:
    """The files a kubeconfig is read from: ``path``, else ``$KUBECONFIG``, else the default."""
    env = os.environ if environ is None else environ
    if path:
        return Source((os.path.expanduser(path),), "")
    listed = tuple(os.path.expanduser(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p)
    if listed:
        return Source(listed, "from $KUBECONFIG")
    return Source((os.path.expanduser(DEFAULT_PATH),), "the default; pass --kubeconfig or set KUBECONFIG")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _read(path: str, source: Source) -> dict[str, Any] | None:
    """One file's mapping; None for an empty file in a ``$KUBECONFIG`` list (it adds nothing)."""
    where = f"kubeconfig {path}" + (f" ({source.origin})" if source.origin else "")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory, not a file") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{where}: not valid YAML ({at}{_one_line(err.problem or err)})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({_one_line(err)})") from None
    if loaded is None:
        if len(source.paths) == 1:
            raise ConfigError(f"{where}: the file is empty")
        return None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where}: not a kubeconfig (a YAML mapping of clusters, contexts and users), "
                          f"but a {type(loaded).__name__}")
    for item in _LISTS:
        if not isinstance(loaded.get(item) or [], list):
            raise ConfigError(f"{where}: {item} must be a list")
    return loaded


def _resolved(item: str, entry: dict[str, Any], base: str) -> dict[str, Any]:
    """``entry`` with its relative file references made absolute against ``base``."""
    body_key, fields = _FILE_FIELDS.get(item, ("", ()))
    body = entry.get(body_key)
    if not isinstance(body, dict):
        return entry
    fixed = {k: os.path.join(base, v) if k in fields and isinstance(v, str) and v and not os.path.isabs(v) else v
             for k, v in body.items()}
    return {**entry, body_key: fixed}


def _merge(source: Source) -> tuple[ConfigNode, dict[str, dict[str, Any]]]:
    """The merged config as the library's nodes (each remembers its file, for relative paths)."""
    merged: dict[str, Any] = {item: [] for item in _LISTS}
    named: dict[str, dict[str, Any]] = {item: {} for item in _LISTS}
    first: str | None = None
    found = [path for path in source.paths if os.path.exists(path)]
    if not found:
        what = "no such file" if len(source.paths) == 1 else "none of these files exists"
        raise ConfigError(f"{source.describe()}: {what}")
    for path in found:
        loaded = _read(path, source)
        if loaded is None:
            continue
        first = first or path
        for item in _LISTS:
            for entry in loaded.get(item) or []:
                name = entry.get("name") if isinstance(entry, dict) else None
                if not isinstance(name, str) or not name:
                    raise ConfigError(f"kubeconfig {path}: an entry of {item} has no name")
                if name not in named[item]:
                    entry = _resolved(item, entry, os.path.dirname(os.path.abspath(path)))
                    named[item][name] = entry
                    merged[item].append(ConfigNode(f"{path}/{item}/{name}", entry, path))
        if "current-context" not in merged and loaded.get("current-context"):
            merged["current-context"] = loaded["current-context"]
    if first is None:
        raise ConfigError(f"{source.describe()}: every file is empty")
    return ConfigNode(first, merged, first), named


def _choose(source: Source, merged: ConfigNode, named: Mapping[str, Mapping[str, Any]],
            context: str | None) -> str:
    contexts = sorted(named["contexts"])
    listed = f"its contexts: {', '.join(contexts)}" if contexts else "it defines no contexts"
    chosen = context or merged.value.get("current-context")
    if not chosen:
        raise ConfigError(f"{source.describe()}: no current context is set ({listed}); choose one with "
                          "`kubectl config use-context NAME` or pass --context")
    entry = named["contexts"].get(chosen)
    if entry is None:
        raise ConfigError(f"{source.describe()}: context {chosen} does not exist ({listed})")
    body = entry.get("context") if isinstance(entry.get("context"), dict) else {}
    cluster = body.get("cluster")
    if not cluster or cluster not in named["clusters"]:
        raise ConfigError(f"{source.describe()}: context {chosen} names cluster {cluster or '(none)'}, "
                          "which is not defined")
    cluster_body = named["clusters"][cluster].get("cluster")
    if not isinstance(cluster_body, dict) or not cluster_body.get("server"):
        raise ConfigError(f"{source.describe()}: cluster {cluster} (of context {chosen}) has no server")
    return str(chosen)


def _loader(source: Source, context: str | None) -> KubeConfigLoader:
    merged, named = _merge(source)
    chosen = _choose(source, merged, named, context)
    try:
        return KubeConfigLoader(config_dict=merged, active_context=chosen, config_base_path=None)
    except (ConfigException, AssertionError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"{source.describe()}: {_one_line(err) or type(err).__name__}") from None


async def load_kubeconfig(path: str | None, *, context: str | None = None,
                          configuration: Configuration) -> Source:
    """Fill ``configuration`` from a kubeconfig (see the module contract); returns where it came from."""
    source = source_for(path)
    loader = await asyncio.to_thread(_loader, source, context)
    try:
        await loader.load_and_set(configuration)
    except (ConfigException, OSError, ValueError, AssertionError, KeyError, TypeError) as err:
        raise ConfigError(f"{source.describe()}: {_one_line(err) or type(err).__name__}") from None
    return source
