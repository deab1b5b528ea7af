"""An informer answers only when it knows: served and synced, or a typed refusal."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cozygpu.cache.errors import CacheError, KindNotServed, NotSynced
from cozygpu.cache.frozen import freeze
from cozygpu.cache.informer import Informer, resource_version_at_least
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event
from cozygpu.cache.triggers import Trigger
from tests.support.clock import settle

SPEC = KindSpec("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True)


def raw(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "tenant-a", "resourceVersion": rv}, **extra}


def test_reading_before_discovery_answers_is_not_synced() -> None:
    informer = Informer(SPEC)
    with pytest.raises(NotSynced, match="discovery"):
        informer.store  # noqa: B018
    assert informer.served is None
    assert not informer.has_synced


def test_reading_an_unserved_kind_says_why_instead_of_returning_nothing() -> None:
    informer = Informer(SPEC)
    informer.end_cycle("no CustomResourceDefinition virtualmachineinstances.kubevirt.io")
    with pytest.raises(KindNotServed) as refused:
        informer.store  # noqa: B018
    assert refused.value.kind == SPEC.key
    assert "virtualmachineinstances.kubevirt.io" in refused.value.reason
    assert isinstance(refused.value, CacheError)


def test_reading_a_served_kind_before_its_first_list_is_not_synced() -> None:
    informer = Informer(SPEC)
    informer.begin_cycle()
    with pytest.raises(NotSynced, match="first list"):
        informer.store  # noqa: B018


def test_the_first_list_makes_the_store_readable_and_fires_triggers_even_when_empty() -> None:
    informer = Informer(SPEC)
    trigger = Trigger()
    informer.add_trigger(trigger)
    feed = informer.begin_cycle()
    trigger.poll()
    feed.replace([], "10")
    assert informer.has_synced
    assert len(informer.store) == 0
    assert trigger.poll() == frozenset({SPEC.key})


def test_a_trigger_added_with_a_predicate_fires_only_for_changes_it_passes_and_always_on_sync() -> None:
    informer = Informer(SPEC)
    filtered, plain = Trigger("filtered"), Trigger("plain")
    informer.add_trigger(filtered, when=lambda event: event.obj["metadata"]["name"] == "wanted")
    informer.add_trigger(plain)
    feed = informer.begin_cycle()
    feed.replace([], "1")
    assert filtered.poll() == plain.poll() == frozenset({SPEC.key}), "the first list wakes both"
    feed.apply("ADDED", feed.prepare(raw("other", "2")))
    assert filtered.poll() is None
    assert plain.poll() == frozenset({SPEC.key})
    feed.apply("ADDED", feed.prepare(raw("wanted", "3")))
    assert filtered.poll() == frozenset({SPEC.key})
    informer.remove_trigger(filtered)
    feed.apply("MODIFIED", feed.prepare(raw("wanted", "4")))
    assert filtered.poll() is None


def test_stored_objects_are_frozen_transformed_and_carry_kind_and_api_version() -> None:
    spec = KindSpec("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True,
                    transform=lambda o: {**o, "status": {"kept": True}})
    informer = Informer(spec)
    feed = informer.begin_cycle()
    decoded = raw("vm1", "5", status={"big": "x" * 100})
    decoded["metadata"]["managedFields"] = [{"manager": "virt-controller"}]
    feed.replace([feed.prepare(decoded)], "5")
    stored = informer.store.get("tenant-a", "vm1")
    assert stored is not None
    assert stored["status"] == {"kept": True}
    assert "managedFields" not in stored["metadata"]
    assert (stored["apiVersion"], stored["kind"]) == ("kubevirt.io/v1", "VirtualMachineInstance")
    with pytest.raises(TypeError):
        stored["status"]["kept"] = False


def test_an_unchanged_object_is_reused_on_relist_without_transforming_again() -> None:
    calls: list[str] = []

    def transform(obj: dict[str, Any]) -> dict[str, Any]:
        calls.append(obj["metadata"]["resourceVersion"])
        return obj

    informer = Informer(KindSpec("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True,
                                 transform=transform))
    feed = informer.begin_cycle()
    feed.replace([feed.prepare(raw("vm1", "5"))], "5")
    first = informer.store.get("tenant-a", "vm1")
    again = feed.prepare(raw("vm1", "5"))
    changed = feed.prepare(raw("vm1", "6"))
    assert again is first
    assert changed is not first
    assert calls == ["5", "6"]


def test_handlers_see_each_change_after_the_store_has_it_and_a_failing_handler_harms_no_one() -> None:
    informer = Informer(SPEC)
    seen: list[tuple[str, bool]] = []

    def reads_the_store(event: Event) -> None:
        name = event.obj["metadata"]["name"]
        seen.append((event.type, informer.store.get("tenant-a", name) is not None))

    def broken(event: Event) -> None:
        raise RuntimeError("handler bug")

    informer.subscribe(broken)
    unsubscribe = informer.subscribe(reads_the_store)
    feed = informer.begin_cycle()
    feed.replace([], "1")
    feed.apply("ADDED", feed.prepare(raw("vm1", "2")))
    feed.apply("DELETED", feed.prepare(raw("vm1", "3")))
    unsubscribe()
    feed.apply("ADDED", feed.prepare(raw("vm2", "4")))
    assert seen == [("ADDED", True), ("DELETED", False)]


def test_a_kind_that_goes_unserved_drops_its_store_without_deleting_anything() -> None:
    informer = Informer(SPEC)
    seen: list[Event] = []
    informer.subscribe(seen.append)
    trigger = Trigger()
    informer.add_trigger(trigger)
    feed = informer.begin_cycle()
    feed.replace([feed.prepare(raw("vm1", "2"))], "2")
    trigger.poll()
    seen.clear()
    informer.end_cycle("CustomResourceDefinition virtualmachineinstances.kubevirt.io is being deleted")
    assert seen == [], "an unserved kind is a gap in discovery, not an absence (R-BIND-7)"
    assert trigger.poll() == frozenset({SPEC.key})
    with pytest.raises(KindNotServed):
        informer.store  # noqa: B018
    feed.apply("ADDED", feed.prepare(raw("vm9", "9")))  # a late write from the old cycle is ignored
    assert seen == []
    assert len(informer) == 0


def test_a_new_serve_cycle_starts_from_an_empty_store() -> None:
    informer = Informer(SPEC)
    feed = informer.begin_cycle()
    feed.replace([feed.prepare(raw("vm1", "2"))], "2")
    informer.end_cycle("gone")
    informer.begin_cycle().replace([], "7")
    assert len(informer.store) == 0
    assert informer.resource_version == "7"


@pytest.mark.parametrize(("have", "want", "seen"), [
    ("10", "9", True), ("10", "10", True), ("9", "10", False), ("100", "99", True),
    ("abc", "abc", True), ("abc", "abd", False), ("", "1", False),
])
def test_resource_versions_compare_as_integers_and_otherwise_only_by_equality(have: str, want: str,
                                                                             seen: bool) -> None:
    assert resource_version_at_least(have, want) is seen


async def test_waiting_for_a_resource_version_returns_once_the_store_has_seen_it() -> None:
    informer = Informer(SPEC)
    feed = informer.begin_cycle()
    waiter = asyncio.create_task(informer.wait_for_resource_version("12", timeout=60))
    feed.replace([], "10")
    feed.apply("ADDED", feed.prepare(raw("vm1", "11")))
    await settle()  # long enough for a wrong early return to show
    assert not waiter.done()
    feed.advance("12")  # a bookmark counts
    store = await waiter
    assert store is informer.store
    assert (await informer.wait_for_resource_version("11", timeout=0)) is store


async def test_waiting_for_a_resource_version_of_an_unserved_kind_is_refused() -> None:
    informer = Informer(SPEC)
    informer.begin_cycle().replace([], "10")
    waiter = asyncio.create_task(informer.wait_for_resource_version("12", timeout=60))
    await asyncio.sleep(0)
    informer.end_cycle("no CustomResourceDefinition")
    with pytest.raises(KindNotServed):
        await waiter


async def test_waiting_for_a_resource_version_times_out() -> None:
    informer = Informer(SPEC)
    informer.begin_cycle().replace([], "10")
    with pytest.raises(TimeoutError):
        await informer.wait_for_resource_version("11", timeout=0)


async def test_waiting_for_sync_spans_an_unserved_period() -> None:
    informer = Informer(SPEC)
    informer.end_cycle("not yet")
    waiter = asyncio.create_task(informer.wait_synced(timeout=60))
    await asyncio.sleep(0)
    feed = informer.begin_cycle()
    await settle()  # long enough for a wrong early return to show
    assert not waiter.done()
    feed.replace([freeze({"metadata": {"name": "x", "namespace": "a", "resourceVersion": "1"}})], "1")
    await waiter
