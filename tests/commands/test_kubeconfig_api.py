"""Kubeconfig lists as kubectl reads them: merged in order, first name wins, relative paths per file."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors
from cozygpu.kube.config import source_for


def split(plane: ControlPlane, tmp_path: Path) -> tuple[Path, Path]:
    """The plane's admin kubeconfig as two files in two directories, each naming its files relatively."""
    admin: dict[str, Any] = yaml.safe_load(plane.kubeconfig.read_text())
    (cluster,), (user,) = admin["clusters"], admin["users"]
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    shutil.copy(cluster["cluster"]["certificate-authority"], first / "ca.crt")
    cluster["cluster"]["certificate-authority"] = "ca.crt"
    for key, name in (("client-certificate", "me.crt"), ("client-key", "me.key")):
        shutil.copy(user["user"][key], second / name)
        user["user"][key] = name
    (first / "config").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster], "contexts": admin["contexts"],
        "current-context": admin["current-context"]}))
    decoy = {"name": cluster["name"], "cluster": {"server": "https://127.0.0.1:1"}}
    (second / "config").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [decoy], "users": [user],
        "current-context": "nowhere"}))
    return first / "config", second / "config"


async def test_a_kubeconfig_list_merges_like_kubectl(plane: ControlPlane, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = split(plane, tmp_path)
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'empty'}:{tmp_path / 'missing'}:{second}")

    async with await Client.from_kubeconfig() as client:
        answer = await client.get("/api/v1/namespaces/default")

    assert answer["metadata"]["name"] == "default"
    assert source_for(None).origin == "from $KUBECONFIG"


async def test_the_file_named_on_the_command_line_wins_over_the_environment(
        plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, second = split(plane, tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    with pytest.raises(errors.ConfigError, match=f"kubeconfig {second}: context nowhere does not exist"):
        await Client.from_kubeconfig(str(second))
