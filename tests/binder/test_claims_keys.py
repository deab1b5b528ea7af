"""The claims work as a keyed reconciler (SPEC §1.5): it judges the devices whose hold claim may need a write,
each on its own, and retries a refused one after its own backoff.

The world is the live read model fed the stores' events (``tests.views.test_live_snapshot.World``), with a
DRA class selling the simulated driver's GPUs; ``Server`` stands in for the API server (the patcher itself is
tested against a real one): it applies each claim write to the world, checks its resourceVersion
precondition, refuses the writes a test names, and hands each change to the work as the claim informer
would. The full plane (``test_dra_holds_full_plane_api.py``) runs the same work against the real components.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.api import claims as claims_api
from cozygpu.base.clock import FakeClock
from cozygpu.binder import claims
from cozygpu.binder.binder import CLAIMS, Binder, BinderConfig
from cozygpu.binder.context import Context
from cozygpu.binder.housekeeping import ClaimsWork
from cozygpu.binder.loop import binder_driver
from cozygpu.binder.patcher import Sent, Verb, Write
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed
from cozygpu.cache.frozen import freeze
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event
from cozygpu.devcluster import dra_driver
from cozygpu.kube import Client
from cozygpu.model.dra import DeviceRef
from cozygpu.model.snapshot import DeviceKey, Snapshot
from cozygpu.passes.driver import Progress
from cozygpu.passes.keyed import BASE
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from cozygpu.views.decode_dra import resource_claim_view
from tests.views.test_live_snapshot import World, device, key_of

NS = "tenant-a"
CLAIM = "ResourceClaim"
_versions = itertools.count(1000)


def dra_class() -> dict[str, Any]:
    return {"metadata": {"name": "dra", "resourceVersion": "1"}, "spec": {
        "mode": "Passthrough", "resourceName": f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}",
        "source": {"dra": {"deviceClassName": dra_driver.DEVICE_CLASS}}}}


def hold(name: str, node: str | None, *, count: int = 1, phase: str = "Bound", vmi: str | None = None,
         class_name: str = "dra") -> dict[str, Any]:
    return device(name, NS, class_name=class_name, count=count, phase=phase, node_name=node, vmi=vmi,
                  uid=f"uid-{vmi}" if vmi else "", deleting=False, request=None)


def dra_world(gpus: Mapping[str, int]) -> World:
    """A DRA class, its DeviceClass, and ``gpus`` simulated GPUs on each named node."""
    world = World()
    world.put(keys.GPUCLASS_KIND, dra_class())
    world.put("DeviceClass", dra_driver.device_class())
    for node, count in gpus.items():
        world.put("ResourceSlice", dra_driver.resource_slice(node, f"uid-{node}", count))
    return world


def held(world: World, name: str) -> tuple[str, tuple[DeviceRef, ...]]:
    """The node and devices the claim of device ``name`` holds ("", () while none)."""
    found = world.stores[CLAIM].get((NS, name))
    if found is None:
        return "", ()
    view = resource_claim_view(found)
    return view.node, view.allocated


class Store:
    """The claim store's reads the work makes."""

    def __init__(self, world: World) -> None:
        self._claims = world.stores[CLAIM]

    def get(self, namespace: str | None, name: str) -> Mapping[str, Any] | None:
        return self._claims.get((namespace or "", name))


class Stores:
    def __init__(self, world: World, *, served: bool = True) -> None:
        self._store, self.served = Store(world), served

    def store(self, spec: KindSpec) -> Store:
        assert spec == specs.RESOURCE_CLAIMS, spec
        if not self.served:
            raise KindNotServed(spec.key, "not in discovery")
        return self._store


class Server:
    """Applies claim writes to the world, each checked as the API server checks it, and tells the work."""

    def __init__(self, world: World, work: Callable[[], ClaimsWork]) -> None:
        self.world, self._work = world, work
        #: Predicates over a write: a write one matches is refused (a Conflict), each predicate once.
        self.refuse: list[Callable[[Write], bool]] = []
        self.sent: list[Write] = []

    async def __call__(self, writes: Iterable[Write], record: Writes, *,
                      stop: Callable[[], bool] | None = None) -> Sent:
        planned = list(writes)
        written: list[tuple[Write, dict[str, Any] | None]] = []
        refused: list[Write] = []
        for at, write in enumerate(planned):
            if at and stop is not None and stop():
                return Sent(tuple(written), tuple(refused), tuple(planned[at:]))
            self.sent.append(write)
            rule = next((rule for rule in self.refuse if rule(write)), None)
            if rule is not None:
                self.refuse.remove(rule)
                refused.append(write)
                continue
            taken, answer = self._apply(write)
            if taken:
                written.append((write, answer))
            else:
                refused.append(write)
        return Sent(tuple(written), tuple(refused))

    def _apply(self, write: Write) -> tuple[bool, dict[str, Any] | None]:
        """Whether it was taken (not: its precondition failed, or it exists), and the object stored (None for
        a delete)."""
        parts = write.path.split("/")
        if write.verb is Verb.CREATE:
            assert write.body is not None
            obj = copy.deepcopy(dict(write.body))
            obj["metadata"]["namespace"] = parts[parts.index("namespaces") + 1]
            key = key_of(obj)
            if key in self.world.stores[CLAIM]:
                return False, None
        else:
            key = (parts[parts.index("namespaces") + 1], parts[parts.index("resourceclaims") + 1])
            found = self.world.stores[CLAIM].get(key)
            assert write.resource_version, f"{write.what}: a write that decides carries its resourceVersion"
            if found is None or found["metadata"]["resourceVersion"] != write.resource_version:
                return False, None
            if write.verb is Verb.DELETE:
                self._put(None, key, found)
                return True, None
            assert write.verb is Verb.PATCH
            assert write.body is not None
            obj = copy.deepcopy(found)
            status = dict(obj.get("status") or {})
            for field, value in write.body["status"].items():
                if value is None:
                    status.pop(field, None)
                else:
                    status[field] = value
            obj["status"] = status
        obj["metadata"]["resourceVersion"] = str(next(_versions))
        obj["kind"] = CLAIM
        self._put(obj, key, self.world.stores[CLAIM].get(key))
        return True, obj

    def _put(self, obj: dict[str, Any] | None, key: tuple[str, str], old: Mapping[str, Any] | None) -> None:
        self.world.put(CLAIM, obj, key)
        self.event(obj, old)

    def event(self, obj: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> None:
        """The claim informer's event, to the work's handler."""
        if obj is None:
            assert old is not None
            self._work().claim_changed(Event(CLAIM, "DELETED", freeze(old), freeze(old)))
        else:
            self._work().claim_changed(Event(CLAIM, "MODIFIED" if old is not None else "ADDED", freeze(obj),
                                             freeze(old) if old is not None else None))


class Harness:
    """A claims work over ``world``, its context the world's stores, live model, clock and ``Server``."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.clock = FakeClock()
        self.server = Server(world, lambda: self.work)
        self.stores = Stores(world)
        self.config = BinderConfig(identity="t")
        self.live = world.live
        self.judged: list[DeviceKey] = []
        self.work = ClaimsWork(cast(Context, self))

    @property
    def cache(self) -> Stores:
        return self.stores

    async def snapshot(self) -> tuple[Snapshot, Mapping[DeviceKey, Any], bool]:
        return self.world.live.snapshot(now=self.world.now, sources=self.world.sources()), {}, True

    async def send(self, writes: Iterable[Write], record: Writes, *, stop: Callable[[], bool] | None = None) -> Sent:
        return await self.server(writes, record, stop=stop)

    async def run(self, stop: Callable[[], bool] = lambda: False) -> list[DeviceKey]:
        """One pass; the keys it judged."""
        self.judged = []
        self.server.sent = []
        assert await self.work.run(Writes(), stop) in (Progress.DONE, Progress.MORE)
        return sorted(self.judged)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> list[DeviceKey]:
    """Every key the claims work judges (``claims.device_plan``), in order."""
    judged: list[DeviceKey] = []
    real = claims.device_plan

    def device_plan(snapshot: Snapshot, dra: Any, key: DeviceKey, chosen: Any = None) -> claims.ClaimsPlan:
        judged.append(key)
        return real(snapshot, dra, key, chosen)

    monkeypatch.setattr(claims, "device_plan", device_plan)
    return judged


def settled(world: World) -> dict[str, tuple[str, tuple[DeviceRef, ...]]]:
    return {name: held(world, name) for _ns, name in sorted(world.stores[CLAIM])}


async def test_a_pass_after_one_devices_change_judges_that_device_alone(counting: list[DeviceKey]) -> None:
    world = dra_world({"n1": 2, "n2": 2, "n3": 2})
    for name, node in (("a", "n1"), ("b", "n2"), ("c", "n3")):
        world.put(keys.GPUDEVICE_KIND, hold(name, node))
    world.put(keys.GPUDEVICE_KIND, hold("plain", "n1", class_name="other"))  # not DRA: nothing to hold
    harness = Harness(world)
    await harness.run()
    assert sorted(counting) == [(NS, "a"), (NS, "b"), (NS, "c")], "the term's first pass: every DRA hold"
    assert {name: node for name, (node, refs) in settled(world).items() if len(refs) == 1} == {
        "a": "n1", "b": "n2", "c": "n3"}, "created and allocated in one pass"
    counting.clear()
    await harness.run()  # the claim events of its own writes: each claim judged, nothing to write
    assert harness.server.sent == []
    counting.clear()
    await harness.run()
    assert counting == [], "nothing moved: nothing judged"
    world.put(keys.GPUDEVICE_KIND, hold("b", "n3"))  # b's set moved (placement moved it)
    await harness.run()
    assert sorted(set(counting)) == [(NS, "b"), (NS, "c")], "b, and c on the node b moved to: no other"
    assert held(world, "b")[0] == "n3"
    assert set(held(world, "b")[1]).isdisjoint(held(world, "c")[1])
    assert [w.verb for w in harness.server.sent] == [Verb.PATCH, Verb.PATCH], "deallocated, then allocated"


async def test_a_refused_write_is_retried_for_its_key_alone_after_its_backoff(counting: list[DeviceKey]) -> None:
    world = dra_world({"n1": 2, "n2": 2})
    world.put(keys.GPUDEVICE_KIND, hold("a", "n1"))
    world.put(keys.GPUDEVICE_KIND, hold("b", "n2"))
    harness = Harness(world)
    harness.server.refuse = [lambda w: w.verb is Verb.CREATE and w.what.endswith("/b")] * 2
    await harness.run()
    assert held(world, "a")[0] == "n1"
    assert held(world, "b") == ("", ())
    queue = harness.work.queue
    assert queue.failures((NS, "b")) == 1
    assert queue.take() == [(NS, "a")], "a's claim events queued a; b, refused, waits for its backoff"
    harness.clock.advance(BASE)
    assert queue.ready()
    counting.clear()
    await harness.run()
    assert (NS, "b") in counting
    assert queue.failures((NS, "b")) == 2, "refused again: its backoff doubles"
    harness.clock.advance(BASE)
    assert not queue.ready()
    harness.clock.advance(BASE)
    assert queue.ready()
    counting.clear()
    await harness.run()
    assert counting[0] == (NS, "b")
    assert held(world, "b")[0] == "n2"
    assert queue.failures((NS, "b")) == 0, "taken: its failures forgotten"


async def test_an_allocation_refused_after_its_create_retries_the_key_with_the_allocation_alone() -> None:
    """The two-step write: the create taken, its allocation refused; the key's next pass allocates the claim
    on the version the cache holds, with no second create."""
    world = dra_world({"n1": 2})
    world.put(keys.GPUDEVICE_KIND, hold("a", "n1"))
    harness = Harness(world)
    harness.server.refuse = [lambda w: w.verb is Verb.PATCH]
    await harness.run()
    assert [w.verb for w in harness.server.sent] == [Verb.CREATE, Verb.PATCH]
    assert (NS, "a") in world.stores[CLAIM]
    assert held(world, "a") == ("", ())
    queue = harness.work.queue
    assert queue.failures((NS, "a")) == 1
    harness.clock.advance(BASE)
    assert queue.ready()
    version = world.stores[CLAIM][(NS, "a")]["metadata"]["resourceVersion"]
    await harness.run()
    [allocate] = harness.server.sent
    assert (allocate.verb, allocate.resource_version) == (Verb.PATCH, version)
    assert held(world, "a")[0] == "n1"


async def test_a_hold_claim_deleted_out_of_band_is_made_again_by_its_event(counting: list[DeviceKey]) -> None:
    world = dra_world({"n1": 2})
    world.put(keys.GPUDEVICE_KIND, hold("a", "n1"))
    harness = Harness(world)
    harness.server.refuse = [lambda w: w.verb is Verb.PATCH]  # made, never allocated: no node's units move
    await harness.run()
    harness.clock.advance(60)
    harness.work.queue.take()  # forgotten: only an event may ask for it now
    claim = world.stores[CLAIM][(NS, "a")]
    world.put(CLAIM, None, (NS, "a"))  # someone deletes it
    counting.clear()
    await harness.run()
    assert counting == [], "an unallocated claim gone moves no node's units: the change log names nothing"
    harness.server.event(None, claim)
    await harness.run()
    assert counting == [(NS, "a")]
    assert [w.verb for w in harness.server.sent] == [Verb.CREATE, Verb.PATCH]
    assert held(world, "a")[0] == "n1"


async def test_a_foreign_claims_event_queues_no_device() -> None:
    world = dra_world({"n1": 2})
    harness = Harness(world)
    body = claims_api.hold_claim("a", "uid-a", device_class=dra_driver.DEVICE_CLASS, count=1)
    body["metadata"].update(namespace=NS, ownerReferences=[])
    harness.work.claim_changed(Event(CLAIM, "ADDED", freeze(body)))
    assert len(harness.work.queue) == 0
    own = claims_api.hold_claim("a", "uid-a", device_class=dra_driver.DEVICE_CLASS, count=1)
    own["metadata"]["namespace"] = NS
    harness.work.claim_changed(Event(CLAIM, "ADDED", freeze(own)))
    assert harness.work.queue.take() == [(NS, "a")]


async def test_a_device_gone_has_its_claim_released_on_its_version() -> None:
    world = dra_world({"n1": 2})
    world.put(keys.GPUDEVICE_KIND, hold("a", "n1"))
    harness = Harness(world)
    await harness.run()
    version = world.stores[CLAIM][(NS, "a")]["metadata"]["resourceVersion"]
    await harness.run()
    world.put(keys.GPUDEVICE_KIND, None, (NS, "a"))
    await harness.run()
    [release] = harness.server.sent
    assert (release.verb, release.resource_version) == (Verb.DELETE, version)
    assert (NS, "a") not in world.stores[CLAIM]


async def test_a_claim_under_a_running_vm_is_neither_moved_nor_released() -> None:
    world = dra_world({"n1": 2, "n2": 2})
    world.put("VirtualMachineInstance", {"metadata": {"name": "vm", "namespace": NS, "uid": "uid-vm",
                                                      "resourceVersion": "1"}, "spec": {}, "status": {}})
    world.put(keys.GPUDEVICE_KIND, hold("a", "n1", vmi="vm"))
    harness = Harness(world)
    await harness.run()
    before = held(world, "a")
    world.put(keys.GPUDEVICE_KIND, hold("a", "n2", vmi="vm"))  # moved while its VM exists (R-BIND-7)
    await harness.run()
    assert held(world, "a") == before
    world.put(keys.GPUDEVICE_KIND, hold("a", None, phase="Lost", vmi="vm"))
    await harness.run()
    assert held(world, "a") == before, "a Lost device's claim stays while its VM exists"
    world.put("VirtualMachineInstance", None, (NS, "vm"))  # the VM ends: the change log names it
    await harness.run()
    assert (NS, "a") not in world.stores[CLAIM]


@pytest.mark.parametrize("order", [("a", "b", "c"), ("c", "b", "a")])
async def test_holds_on_one_node_judged_in_one_pass_never_share_a_unit(order: tuple[str, ...]) -> None:
    world = dra_world({"n1": 3})
    harness = Harness(world)
    await harness.run()  # the term's first pass: nothing yet
    for name in order:
        world.put(keys.GPUDEVICE_KIND, hold(name, "n1"))
    await harness.run()
    units = [ref for name in order for ref in held(world, name)[1]]
    assert len(units) == 3
    assert len(set(units)) == 3


async def test_a_hold_short_of_units_is_allocated_when_someone_elses_claim_frees_one() -> None:
    """The foreign claim's release touches its node in the change log: the holds there are judged again."""
    world = dra_world({"n1": 1})
    foreign = claims_api.hold_claim("pod-claim", "uid-pod", device_class=dra_driver.DEVICE_CLASS, count=1)
    foreign["metadata"].update(namespace="default", ownerReferences=[], resourceVersion="1")
    foreign["status"] = claims_api.hold_status("n1", [DeviceRef(dra_driver.DRIVER, "n1", dra_driver.device_name(0))],
                                               device_name="x", device_uid="uid-x", now=world.now)
    world.put(CLAIM, foreign)
    world.put(keys.GPUDEVICE_KIND, hold("a", "n1"))
    harness = Harness(world)
    await harness.run()
    assert held(world, "a") == ("", ()), "short: someone else's claim holds the node's GPU"
    world.put(CLAIM, None, ("default", "pod-claim"))
    await harness.run()
    assert held(world, "a")[0] == "n1"


async def test_nothing_is_judged_while_resource_claims_are_not_served(counting: list[DeviceKey]) -> None:
    world = dra_world({"n1": 1})
    world.put(keys.GPUDEVICE_KIND, hold("a", "n1"))
    harness = Harness(world)
    harness.stores.served = False
    await harness.run()
    assert counting == []


def test_the_claims_lanes_key_whose_time_comes_asks_for_its_lane() -> None:
    clock = FakeClock()
    client = Client("https://127.0.0.1:9", ssl_context=None)
    cache = Cache(client, registry=CollectorRegistry(), clock=clock)
    binder = Binder(cache, client, BinderConfig(identity="t"), clock=clock)
    driver = binder_driver(binder, cache, registry=CollectorRegistry(), clock=clock)
    queue = binder.queues()[CLAIMS]
    assert queue is binder.claims.queue
    queue.add_after(("tenant-a", "d"), 2.0)
    clock.advance(1.0)
    assert not driver.pending(CLAIMS)
    clock.advance(1.0)
    assert driver.pending(CLAIMS), "a refused claim's backoff over: its lane is asked for"
