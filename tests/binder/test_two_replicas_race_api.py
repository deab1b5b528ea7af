"""The race the design exists for: two replicas, the leader killed twenty times mid-pass.

Two ``cozygpu controller --enable-gpu`` processes run against the real API
server. While tenants keep ordering, deleting and starting VMs (the test acts
as the VMI webhook and as virt-controller: it attaches held devices to a VMI
on their resourceVersion, writes a bind request, and on a Succeeded answer
runs a launcher pod on the answer's node), the leader is killed twenty times
at random moments and a fresh replica takes its place, so there are always
two. Most kills are SIGKILL; every fourth leader is instead frozen (SIGSTOP)
until another replica leads, then thawed, so it resumes its pass on its old
view before it notices its term is over — a deposed leader that still writes.
Leader election does not fence: only the resourceVersion on every deciding
write keeps a dead or deposed leader's decisions out.

Afterwards, the API server's state must show: no node with more Bound units
than it serves, no budget exceeded up the ancestry, no set split over nodes,
and no running VM's device detached or moved off its node; and all but the
split sets (which a kill mid-set leaves until the next pass) at every kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import pytest

from cozygpu import keys
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from tests.binder.support import VMI_CRD, VMIS, device_path
from tests.binder.test_controller_binder_api import serving_cert
from tests.binder.world import World, stamp
from tests.runtime.processes import (
    ControllerProcess,
    ControllerProcesses,
    controllers_fixture,  # noqa: F401 - the ``controllers`` fixture
    interleaved_decisions,
)
from tests.support.crds import install_fixture_crd
from tests.support.tenants import Tenants, make_tenants

KILLS = 20
NODES = {"n1": 4, "n2": 4, "n3": 4, "n4": 2}
BUDGET = 10  # of the parent tenant, over its whole subtree; the nodes serve 14
STARTED = "leader-work-started"
NAMESPACES = resource_path("", "v1", "namespaces")


@attrs.define
class Running:
    """A VM the test started: its launcher runs on ``node`` with ``devices``."""

    namespace: str
    vmi: str
    uid: str
    node: str
    devices: tuple[str, ...]


@attrs.define
class Churn:
    """The tenants' side: orders, deletions and VM starts, until ``stop`` is set."""

    admin: Client
    world: World
    tenants: Tenants
    rng: random.Random
    stop: asyncio.Event = attrs.field(factory=asyncio.Event)
    running: list[Running] = attrs.field(factory=list)
    orders: int = 0
    starts: int = 0
    refused: int = 0

    async def order_loop(self) -> None:
        while not self.stop.is_set():
            namespace = self.rng.choice(self.tenants.all)
            body = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                    "metadata": {"name": f"d-{uuid.uuid4().hex[:6]}"},
                    "spec": {"className": self.world.gpu_class, "count": self.rng.choice((1, 1, 2))}}
            await self.admin.create(device_path(namespace), body)
            self.orders += 1
            await asyncio.sleep(self.rng.uniform(0.1, 0.4))

    async def delete_loop(self) -> None:
        """Tenants give up holds they do not run: a deleted device frees its units once released."""
        while not self.stop.is_set():
            await asyncio.sleep(self.rng.uniform(0.5, 1.5))
            idle = [d for d in await all_devices(self.admin, self.tenants)
                    if not (d.get("status") or {}).get("attachment") and not d["metadata"].get("deletionTimestamp")]
            if idle:
                victim = self.rng.choice(idle)
                with contextlib.suppress(errors.NotFound):
                    await self.admin.delete(device_path(victim["metadata"]["namespace"], victim["metadata"]["name"]))

    async def start_loop(self) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(self.rng.uniform(0.3, 1.0))
            await self.start_one()

    async def start_one(self) -> None:
        namespace = self.rng.choice(self.tenants.all)
        free = [d for d in (await self.admin.list_objects(device_path(namespace)))["items"]
                if (d.get("status") or {}).get("phase") == "Bound" and not d["status"].get("attachment")
                and not d["metadata"].get("deletionTimestamp")]
        if not free:
            return
        members = self.rng.sample(free, min(len(free), self.rng.choice((1, 2))))
        name = f"vm-{uuid.uuid4().hex[:6]}"
        vmis = resource_path(*VMIS, namespace=namespace)
        vmi = await self.admin.create(vmis, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                             "metadata": {"name": name}, "spec": {"domain": {"devices": {}}}})
        request = f"r-{uuid.uuid4().hex[:6]}"
        attached: list[str] = []
        for device in members:  # as the webhook does: each member on the version it read, or not at all
            try:
                await self.admin.merge_patch(
                    device_path(namespace, device["metadata"]["name"], status=True),
                    {"status": {"attachment": {"vmi": name, "uid": vmi["metadata"]["uid"], "attachedAt": stamp()},
                                "bindRequest": {"id": request, "vmi": name, "time": stamp()}}},
                    resource_version=device["metadata"]["resourceVersion"])
                attached.append(device["metadata"]["name"])
            except (errors.Conflict, errors.NotFound):
                break
        if len(attached) < len(members):
            await self.undo(namespace, name, attached)
            return
        self.starts += 1
        answer = await self.answer(namespace, attached, request)
        if answer is None or answer.get("result") != "Succeeded":
            self.refused += 1
            await self.undo(namespace, name, attached)
            return
        node = str(answer["node"])
        await self.run_launcher(namespace, vmi, node)
        self.running.append(Running(namespace, name, vmi["metadata"]["uid"], node, tuple(attached)))

    async def answer(self, namespace: str, devices: list[str], request: str) -> dict[str, Any] | None:
        """The binder's one answer on every member, within 15 s (a killed leader's successor answers it)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                while True:
                    answers = []
                    for name in devices:
                        status = (await self.admin.get(device_path(namespace, name))).get("status") or {}
                        answer = status.get("bindAnswer") or {}
                        answers.append(answer if answer.get("id") == request else None)
                    # Every member answered, and alike: a leader killed between members' writes leaves one
                    # member's answer behind, which its successor writes again on every member.
                    if all(answers) and len({(a["result"], a.get("node")) for a in answers if a}) == 1:
                        return answers[0]
                    await asyncio.sleep(0.1)
        return None

    async def undo(self, namespace: str, vmi: str, attached: list[str]) -> None:
        for name in attached:
            with contextlib.suppress(errors.NotFound, errors.Conflict):
                await self.admin.merge_patch(device_path(namespace, name, status=True),
                                             {"status": {"attachment": None, "bindRequest": None}})
        with contextlib.suppress(errors.NotFound):
            await self.admin.delete(resource_path(*VMIS, namespace=namespace, name=vmi))

    async def run_launcher(self, namespace: str, vmi: dict[str, Any], node: str) -> None:
        """virt-controller's part: the launcher pod, Running on the node, named in ``status.activePods``."""
        pods = resource_path("", "v1", "pods", namespace=namespace)
        name = vmi["metadata"]["name"]
        owner = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": name,
                 "uid": vmi["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        pod = await self.admin.create(pods, {"metadata": {
            "name": f"virt-launcher-{name}-x1", "ownerReferences": [owner],
            "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": vmi["metadata"]["uid"]}},
            "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "virt-launcher"}]}})
        await self.admin.merge_patch(f"{pods}/{pod['metadata']['name']}/status", {"status": {"phase": "Running"}})
        await self.admin.merge_patch(
            resource_path(*VMIS, namespace=namespace, name=name, subresource="status"),
            {"status": {"phase": "Running", "nodeName": node, "activePods": {pod["metadata"]["uid"]: node}}})


async def all_devices(admin: Client, tenants: Tenants) -> list[dict[str, Any]]:
    """The tenants' devices as of one instant: one list of every namespace (a consistent read), never one list
    per namespace. Lists taken one after another saw a deleted device's units in one namespace and the order
    bound onto them a moment later in the next: an over-booking no single instant ever had."""
    ours = set(tenants.all)
    return [d for d in (await admin.list_objects(device_path(None)))["items"] if d["metadata"]["namespace"] in ours]


def invariant_breaches(world: World, tenants: Tenants, devices: list[dict[str, Any]],
                       running: list[Running], *, settled: bool) -> list[str]:
    """Every way the API server's state breaks the binder's promises (empty when it keeps them all).

    A set is written member by member, so a leader killed in between leaves it split until the next
    pass gathers it (R-BIND-4): sets are checked only once ``settled``; units, budgets and running
    VMs at every moment.
    """
    breaches: list[str] = []
    served = {world.node_name(short): units for short, units in NODES.items()}
    bound: dict[str, int] = {}
    subtree = 0
    sets: dict[tuple[str, str], set[tuple[str, str | None]]] = {}
    by_key = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in devices}
    for device in devices:
        status = device.get("status") or {}
        phase, count = status.get("phase"), int(device["spec"]["count"])
        namespace = device["metadata"]["namespace"]
        if phase == "Bound":
            bound[status["nodeName"]] = bound.get(status["nodeName"], 0) + count
        if phase in ("Bound", "Lost") and namespace != tenants.other:
            subtree += count
        attachment = status.get("attachment")
        request, answer = status.get("bindRequest") or {}, status.get("bindAnswer") or {}
        answered = bool(request.get("id")) and answer.get("id") == request.get("id")
        # A start's set is split until the binder answers it (it gathers the set to answer): count answered sets.
        if attachment and answered and phase in ("Bound", "Lost"):
            sets.setdefault((namespace, attachment["vmi"]), set()).add((phase, status.get("nodeName")))
    for node, units in sorted(bound.items()):
        if units > served.get(node, 0):
            here = [f"{d['metadata']['namespace']}/{d['metadata']['name']}x{d['spec']['count']} "
                    f"{[(c.get('reason'), c.get('lastTransitionTime')) for c in d['status'].get('conditions', [])]}"
                    for d in devices if (d.get("status") or {}).get("phase") == "Bound"
                    and d["status"].get("nodeName") == node]
            breaches.append(f"node {node}: {units} units Bound, it serves {served.get(node, 0)}: {here}")
    if subtree > BUDGET:
        breaches.append(f"budget of {tenants.parent}: {subtree} units held in its subtree, {BUDGET} allowed")
    for (namespace, vmi), places in sorted(sets.items()):
        if settled and len(places) > 1:
            breaches.append(f"VMI {namespace}/{vmi}: its set is split: {sorted(places, key=str)}")
    for vm in running:
        for name in vm.devices:
            held = by_key.get((vm.namespace, name))
            status = (held or {}).get("status") or {}
            attachment = status.get("attachment") or {}
            if held is None or attachment.get("vmi") != vm.vmi:
                breaches.append(f"VMI {vm.namespace}/{vm.vmi} runs, but its device {name} was detached")
            elif (status.get("phase"), status.get("nodeName")) != ("Bound", vm.node):
                breaches.append(f"VMI {vm.namespace}/{vm.vmi} runs on {vm.node}, but its device {name} is "
                                f"{status.get('phase')} on {status.get('nodeName')}")
    return breaches


@pytest.fixture
async def tenants(admin: Client) -> Tenants:
    parent = f"tenant-{uuid.uuid4().hex[:8]}"
    made = await make_tenants(admin, parent, f"tenant-{uuid.uuid4().hex[:8]}")
    await admin.create(resource_path("", "v1", "resourcequotas", namespace=parent), {
        "metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": {keys.QUOTA_TOTAL: str(BUDGET)}}})
    return made  # left in place like every test's namespace: the fast plane runs no namespace controller


async def leader(replicas: list[ControllerProcess], seen: dict[str, int]) -> ControllerProcess:
    """The replica that starts leader work next (a term begun since the last kill)."""
    try:
        async with asyncio.timeout(60):
            while True:
                for replica in replicas:
                    if len(replica.events(STARTED)) > seen.get(replica.identity, 0):
                        seen[replica.identity] = len(replica.events(STARTED))
                        return replica
                await asyncio.sleep(0.05)
    except TimeoutError:
        logs = "\n".join(f"{r.identity}: {line}" for r in replicas for line in r.raw[-8:])
        raise AssertionError(f"no replica began leading within 60 s:\n{logs}") from None


async def test_two_replicas_with_the_leader_killed_twenty_times_keep_every_promise(
        plane: ControlPlane, admin: Client, namespace: str, controllers: ControllerProcesses,
        tenants: Tenants, tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print(f"race seed {seed}")
    rng = random.Random(seed)
    await install_fixture_crd(admin, VMI_CRD)
    world = await World.make(admin, tenants.children[0])
    for short, units in NODES.items():
        await world.node(short, units)
    serving_cert(plane, tmp_path)
    flags = ("--enable-gpu", "--cert-dir", str(tmp_path), "--webhook-addr", "127.0.0.1:0")

    churn = Churn(admin, world, tenants, rng)
    replicas = [await controllers.start(f"r{i}", *flags) for i in range(2)]
    seen: dict[str, int] = {}
    checks: list[str] = []
    stalled = 0
    try:
        async with asyncio.TaskGroup() as tasks:
            for loop in (churn.order_loop, churn.delete_loop, churn.start_loop):
                tasks.create_task(loop())
            current = await leader(replicas, seen)
            for kill in range(KILLS):
                await asyncio.sleep(rng.uniform(0.2, 2.5))  # somewhere in the middle of its passes
                if kill % 4 == 3:
                    # Deposed, not dead: frozen mid-pass until another replica leads, then thawed; what it
                    # was about to write goes out on its old view before it notices its term is over.
                    current.proc.send_signal(signal.SIGSTOP)
                    successor = await leader(replicas, seen)
                    current.proc.send_signal(signal.SIGCONT)
                    await current.exit_code(timeout=30)
                    stalled += 1
                else:
                    await current.kill()
                print(f"{datetime.now(UTC):%H:%M:%S.%f} {'froze' if kill % 4 == 3 else 'killed'} {current.identity}")
                replicas.remove(current)
                replicas.append(await controllers.start(f"r{kill + 2}", *flags))
                current = successor if kill % 4 == 3 else await leader(replicas, seen)
                checks.extend(f"after kill {kill + 1}: {b}" for b in invariant_breaches(
                    world, tenants, await all_devices(admin, tenants), churn.running, settled=False))
            churn.stop.set()
        # The last leader answers what is left; the state it leaves must keep every promise too.
        await asyncio.sleep(3)
        final = await all_devices(admin, tenants)
        checks.extend(f"final: {b}" for b in invariant_breaches(world, tenants, final, churn.running, settled=True))
        held = sum(1 for d in final if (d.get("status") or {}).get("phase") == "Bound")
        print(f"{KILLS - stalled} SIGKILLs, {stalled} leaders frozen and thawed after a successor; "
              f"orders {churn.orders}, starts {churn.starts} ({churn.refused} refused), running {len(churn.running)}, "
              f"devices Bound at the end {held}, at {datetime.now(UTC):%H:%M:%S}")
        checks.extend(f"leaders: {b}" for b in interleaved_decisions(controllers.started))
        if checks:
            logs = tmp_path / "replicas.log"
            logs.write_text("".join(f"{r.identity}: {line}\n" for r in controllers.started for line in r.raw))
            raise AssertionError("\n".join([*checks, f"every replica's log: {logs}"]))
        # The run did what it claims: VMs ran through kills, and orders were placed by successive leaders.
        assert churn.running, "no VM start succeeded: nothing was at stake"
        assert held > 0
    finally:
        await world.cleanup()
