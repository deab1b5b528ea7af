"""The VMI webhook (mutating, CREATE, VMIs labelled with device-refs): attach, ask the binder, wait (R-ADM-2, R-ADM-3).

Order of work, so that a dry run and a refused start leave no trace:
1. Every refusal check, on this replica's snapshot (``vmi_plan.plan_start``),
   and, for a member of a DRA-sourced class, that the cache serves
   ResourceClaims (its hold is one). A dry run ends here, allowed with the
   ``gpus`` and ``resourceClaims`` entries the start would get.
2. Writes: create the template devices (the template-device label, no owner
   reference: the VMI has no UID yet; the binder deletes them with their VMI),
   then attach every member and record one bind request on it, each a status
   merge patch preconditioned on the resourceVersion the decision read. On a
   Conflict the device is read again and attached only if still free (so two
   VMIs never take one device: the later one finds the other's attachment).
   The creates run concurrently, then the attachments do (at most
   ``WRITE_CONCURRENCY`` at once). A write is never cancelled because a
   sibling failed or the request ended: every write sent finishes and is
   recorded before the undo runs, so the undo knows all of them; after a
   failure no further write starts.
3. Wait at most ``bind_wait`` for the binder's answer on every member,
   watching the cache's GPUDevice events (no polling). A DRA member's answer
   is ready only once, beside it, the cache's ResourceClaim of that device
   (named after it) shows its allocation on the device's node with all its
   devices (``vmi_plan.claim_unready``), watched on ResourceClaim events in
   the same wait: a claim not allocated yet would be allocated by
   kube-scheduler itself, maybe on another node.
4. Every member Succeeded → allowed, with one ``gpus`` entry per GPU (a DRA
   member's naming its claim's ``resourceClaims`` entry and request, never a
   ``deviceName``) and never a ``resources`` key. Otherwise undo what step 2
   wrote (clear the attachment and request where they are still this
   request's, delete the template devices created, by UID) and refuse with
   the binder's reason, with "no answer within N s" and the leader's state
   from its Lease, or, when every answer came but a DRA member's claim did
   not show its allocation, with the device, the claim, the node and what
   the claim showed.

Re-invocation (R-ADM-3): the plan finds every member attached to this VMI's
name with one recent request, answered or not, and takes it as its own: it
writes nothing and waits for (or reads) that answer. The answer lives in
device status, so another replica sees it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import attrs

from cozygpu import keys
from cozygpu.admission import bounds
from cozygpu.admission.envelope import Request, Verdict
from cozygpu.admission.metrics import AdmissionMetrics
from cozygpu.admission.refs import RefsError, parse_refs
from cozygpu.admission.view import NotReady, SnapshotSource
from cozygpu.admission.vmi_plan import (
    Member,
    Refused,
    StartPlan,
    claim_unready,
    gpus_patch,
    plan_start,
)
from cozygpu.api import admission_devices as devices
from cozygpu.api import kubevirt, leases, meta
from cozygpu.api.devices import node_name as device_node
from cozygpu.api.times import rfc3339
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.logging import get_logger
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import CacheError, KindNotServed, NotSynced
from cozygpu.cache.store import Event
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model import refusals
from cozygpu.model.refusals import Refusal
from cozygpu.views import specs

_log = get_logger("cozygpu.admission.vmi")

SUCCEEDED = "Succeeded"
#: Attempts at one device's attachment write when its resourceVersion moved under it.
ATTEMPTS = 3
#: Writes of one start (and of its undo) in flight at once.
WRITE_CONCURRENCY = 8


@attrs.frozen(kw_only=True)
class VMIConfig:
    #: The controller's namespace (its leader Lease is read on a timeout).
    namespace: str
    bind_wait: float
    raw_forbidden: bool
    attachment_grace: timedelta = timedelta(minutes=2)


def _device_path(namespace: str, name: str = "", *, status: bool = False) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace, name=name or None,
                         subresource="status" if status else None)


@attrs.frozen
class _Unallocated:
    """Every answer is Succeeded on one node, but a DRA member's claim does not show its allocation there yet."""

    device: str
    node: str
    #: What the claim showed (``vmi_plan.claim_unready``), for the refusal if the wait ends so.
    seen: str


def _requested(device: Mapping[str, Any] | None, request_id: str) -> bool:
    """``device`` is attached by the bind request ``request_id``."""
    attached = devices.attachment(device) if device is not None else None
    return attached is not None and attached.request_id == request_id


class VMIWebhook:
    """The VMI start admission (see the module docstring)."""

    def __init__(self, cache: Cache, client: Client, source: SnapshotSource, config: VMIConfig,
                 metrics: AdmissionMetrics | None = None, clock: Clock | None = None) -> None:
        self._cache = cache
        #: What ``attachedAt`` and the bind request's time say (injected: a test moves time).
        self._clock: Clock = clock if clock is not None else LoopClock()
        self._client = client
        self._source = source
        self._config = config
        self._metrics = metrics

    async def __call__(self, request: Request) -> Verdict:
        if request.operation != "CREATE":
            return Verdict.allow()
        obj = request.object
        namespace = request.namespace or meta.namespace(obj)
        try:
            refs = parse_refs(kubevirt.device_refs(obj))
            snapshot = await self._source.snapshot()
            recent = timedelta(seconds=2 * self._config.bind_wait + 5)
            plan = plan_start(snapshot, obj, refs, namespace=namespace, raw_forbidden=self._config.raw_forbidden,
                              grace=self._config.attachment_grace, recent=recent)
            patch = gpus_patch(obj, plan.entries, plan.claims)
            versions = self._versions(plan)
            self._claims_served(plan)
        except RefsError as error:
            label = f"VMI {bounds.clip(namespace)}/{bounds.clip(meta.name(obj) or request.name or '?')}"
            return Verdict.refuse(refusals.invalid_device_refs(label, str(error)))
        except NotReady as error:
            return Verdict.not_ready(str(error))
        except Refused as error:
            return Verdict.refuse(error.refusal)
        if request.dry_run:
            return Verdict.allow(patch, message=plan.said)
        return await self._start(plan, patch, versions)

    def _versions(self, plan: StartPlan) -> dict[str, str]:
        """The resourceVersions the decision read: in the same turn as the snapshot, so they are its objects'."""
        store = self._cache.store(specs.GPU_DEVICES)
        found: dict[str, str] = {}
        for member in plan.members:
            if member.existing is None:
                continue
            obj = store.get(plan.namespace, member.name)
            if obj is None:
                raise Refused(refusals.unknown_device(plan.namespace, member.name))
            found[member.name] = meta.resource_version(obj)
        return found

    def _claims_served(self, plan: StartPlan) -> None:
        """A DRA member's hold is a ResourceClaim: without the kind served it cannot exist, so the start is
        refused before any write (served but not listed yet on this replica: not ready, as for the snapshot)."""
        dra = [member for member in plan.members if member.dra]
        if not dra:
            return
        try:
            self._cache.store(specs.RESOURCE_CLAIMS)
        except KindNotServed as error:
            refusal = refusals.dra_not_served(plan.namespace, dra[0].name, class_name=dra[0].class_name,
                                              problem=error.reason)
            raise Refused(refusal) from None
        except NotSynced as error:
            raise NotReady(f"this replica's cache of ResourceClaims has not synced yet: {error}") from None

    # -- the writes ---------------------------------------------------------------------

    async def _start(self, plan: StartPlan, patch: list[dict[str, Any]], versions: Mapping[str, str]) -> Verdict:
        writes = _Writes(self._client, plan, versions)
        request_id = plan.adopted_request
        try:
            if not request_id:
                request_id = uuid.uuid4().hex
                await writes.write(request_id, now=self._clock.wall())
        except Refused as error:
            await asyncio.shield(writes.undo(request_id, self._cache))
            return Verdict.refuse(error.refusal)
        except BaseException:
            await asyncio.shield(writes.undo(request_id, self._cache))
            raise
        try:
            failure = await self._await_answers(plan, request_id)
        except BaseException:
            await asyncio.shield(writes.undo(request_id, self._cache))
            raise
        if failure is None:
            return Verdict.allow(patch, message=plan.said)
        await asyncio.shield(writes.undo(request_id, self._cache))
        return Verdict.refuse(failure)

    async def _await_answers(self, plan: StartPlan, request_id: str) -> Refusal | None:
        """None when every member's answer is Succeeded on one node (and each DRA member's claim shows its
        allocation there); else why not. Woken by GPUDevice events and, with DRA members, by their claims'."""
        started = time.perf_counter()
        watched = [specs.GPU_DEVICES]
        when: dict[str, Callable[[Event], bool]] = {}
        held = {(plan.namespace, member.name) for member in plan.members if member.dra}
        if held:
            watched.append(specs.RESOURCE_CLAIMS)
            when[specs.RESOURCE_CLAIMS.key] = lambda event: (meta.namespace(event.obj), meta.name(event.obj)) in held
        informers = [self._cache.informer(spec) for spec in watched]
        trigger = self._cache.trigger(*watched, name="vmi admission", when=when)
        label = f"VMI {plan.namespace}/{plan.vmi}"
        result = "timeout"
        # Template devices this start created: until this replica's cache has shown one, its absence is
        # the watch not having caught up, not a deletion.
        unseen = {member.name for member in plan.to_create}
        unallocated: _Unallocated | None = None
        try:
            async with asyncio.timeout(self._config.bind_wait):
                while True:
                    answers = self._answers(plan, request_id, unseen)
                    unallocated = answers if isinstance(answers, _Unallocated) else None
                    if answers is True:
                        result = SUCCEEDED
                        return None
                    if answers is not None and not isinstance(answers, _Unallocated):
                        result = str(answers.reason)
                        return answers
                    await trigger.wait()
        except TimeoutError:
            if unallocated is not None:
                return refusals.claim_not_allocated(plan.namespace, unallocated.device, vmi_subject=label,
                                                    node=unallocated.node, seen=unallocated.seen,
                                                    wait=self._config.bind_wait)
            return await self._timed_out(label)
        finally:
            for informer in informers:
                informer.remove_trigger(trigger)
            if self._metrics is not None:
                self._metrics.bind_wait.labels(result).observe(time.perf_counter() - started)

    def _answers(self, plan: StartPlan, request_id: str,
                 unseen: set[str]) -> Refusal | Literal[True] | _Unallocated | None:
        """True when every member is answered Succeeded on one node, why not once all are answered, else None.

        ``unseen``: members this start created that the cache has not shown yet (a member leaves it when
        seen); one of them missing from the cache is not an answer yet, any other missing one was deleted.
        A DRA member answered Succeeded is ready only once its claim shows its allocation on the device's
        ``status.nodeName``; until then the answer is an ``_Unallocated`` (still waiting, with what it saw).
        """
        store = self._cache.store(specs.GPU_DEVICES)
        label = f"VMI {plan.namespace}/{plan.vmi}"
        nodes: set[str] = set()
        held: list[tuple[Member, str]] = []
        for member in plan.members:
            obj = store.get(plan.namespace, member.name)
            if obj is None:
                if member.name in unseen:
                    return None
                return refusals.device_deleted_while_admitting(plan.namespace, member.name, vmi=plan.vmi)
            unseen.discard(member.name)
            # Every waiter runs this on every device event: the id first, the whole answer once it is ours.
            answer = devices.bind_answer(obj) if devices.answer_id(obj) == request_id else None
            if answer is None:
                return None
            if answer.result != SUCCEEDED:
                return refusals.binder_refused(label, reason=answer.reason, message=answer.message)
            nodes.add(answer.node)
            if member.dra:
                # The binder writes the device's nodeName and its answer in one patch: the same node.
                held.append((member, device_node(obj) or answer.node))
        if len(nodes) != 1 or "" in nodes:
            return refusals.answers_split(label, nodes)
        return self._claims_allocated(plan, held) if held else True

    def _claims_allocated(self, plan: StartPlan, held: list[tuple[Member, str]]
                          ) -> Refusal | Literal[True] | _Unallocated | None:
        """True when each DRA member's claim shows its allocation on its device's node; else the first that
        does not (an ``_Unallocated``), None while this replica has not listed claims, or why it never will."""
        try:
            claim_store = self._cache.store(specs.RESOURCE_CLAIMS)
        except KindNotServed as error:
            member = held[0][0]
            return refusals.dra_not_served(plan.namespace, member.name, class_name=member.class_name,
                                           problem=error.reason)
        except NotSynced:
            return None
        for member, node in held:
            seen = claim_unready(claim_store.get(plan.namespace, member.name), device=member.name, node=node,
                                 count=member.count)
            if seen:
                return _Unallocated(device=member.name, node=node, seen=seen)
        return True

    async def _timed_out(self, label: str) -> Refusal:
        """No answer within the bind wait, with the leader's state read once from its Lease."""
        lease = f"{self._config.namespace}/{keys.LEADER_LEASE}"
        lease_path = resource_path("coordination.k8s.io", "v1", "leases", namespace=self._config.namespace,
                                   name=keys.LEADER_LEASE)
        try:
            found = await self._client.get_or_none(lease_path, timeout=1.0, attempts=1)
        except (errors.KubeError, TimeoutError) as error:
            return refusals.bind_timeout(label, wait=self._config.bind_wait, lease=lease, lease_error=str(error))
        holder = leases.holder(found)
        return refusals.bind_timeout(label, wait=self._config.bind_wait, lease=lease,
                                     holder=holder.identity or None, renewed=holder.renewed or None)


class _Writes:
    """What one start wrote, so it can be undone."""

    def __init__(self, client: Client, plan: StartPlan, versions: Mapping[str, str]) -> None:
        self._client = client
        self._plan = plan
        self._versions = dict(versions)
        #: Template devices this start created: name -> UID.
        self.created: dict[str, str] = {}
        #: Members whose attachment write was sent (or about to be): the undo checks each by request id.
        self.attached: list[str] = []
        self._limit = asyncio.Semaphore(WRITE_CONCURRENCY)
        #: Writes still running; the undo waits for them before it looks at what was written.
        self._pending: set[asyncio.Task[None]] = set()
        #: Set by the undo: no write starts any more.
        self._stopped = False

    async def write(self, request_id: str, *, now: datetime) -> None:
        """Create the template devices, then attach every member; each step's writes concurrently.

        Raises the first failure (a ``Refused`` if any) once every write of the
        step has finished, so what was written is all recorded for the undo.
        """
        plan = self._plan

        async def create(member: Member) -> None:
            self._versions[member.name] = await self._create(member)

        async def attach(member: Member) -> None:
            await self._attach(member, self._versions[member.name], request_id, now=now)

        await self._each(plan.to_create, create)
        await self._each(plan.members, attach)

    async def _each(self, members: Sequence[Member], write: Callable[[Member], Awaitable[None]]) -> None:
        failures: list[BaseException] = []

        async def one(member: Member) -> None:
            async with self._limit:
                if self._stopped or failures:
                    return
                try:
                    await write(member)
                except Exception as error:  # raised below, once every sibling has finished
                    failures.append(error)

        tasks = {asyncio.create_task(one(member), name=f"admission write {member.name}") for member in members}
        if not tasks:
            return
        self._pending |= tasks
        # asyncio.wait never cancels the writes, not even when this call is: a write cancelled in
        # flight may still have been applied, and the undo could not know it.
        await asyncio.wait(tasks)
        self._pending -= tasks
        failures += [asyncio.CancelledError(f"{task.get_name()} was cancelled") for task in tasks if task.cancelled()]
        if failures:
            raise next((f for f in failures if isinstance(f, Refused)), failures[0])

    async def _create(self, member: Member) -> str:
        plan = self._plan
        body = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                "metadata": {"name": member.name, "namespace": plan.namespace,
                             "labels": {keys.TEMPLATE_DEVICE_LABEL: "true"}, "finalizers": [keys.DEVICE_FINALIZER]},
                "spec": {"className": member.class_name, "count": member.count}}
        try:
            made = await self._client.create(_device_path(plan.namespace), body)
        except errors.AlreadyExists:
            raise Refused(refusals.template_taken(plan.namespace, member.name, vmi=plan.vmi)) from None
        except errors.ApiError as error:
            raise Refused(refusals.template_create_refused(plan.namespace, member.name, vmi=plan.vmi,
                                                           problem=error.message)) from None
        self.created[member.name] = meta.uid(made)
        return meta.resource_version(made)

    async def _attach(self, member: Member, version: str, request_id: str, *, now: datetime) -> None:
        plan = self._plan
        patch = {"status": {
            "attachment": {"vmi": plan.vmi, "uid": None, "attachedAt": rfc3339(now), "requestId": request_id},
            "bindRequest": {"id": request_id, "vmi": plan.vmi, "time": rfc3339(now)}}}
        path = _device_path(plan.namespace, member.name, status=True)
        self.attached.append(member.name)  # before the write: its answer may be lost, the undo checks the request id
        for attempt in range(ATTEMPTS):
            try:
                await self._client.merge_patch(path, patch, resource_version=version)
                return
            except errors.Conflict:
                if attempt == ATTEMPTS - 1:
                    break
                current = await self._client.get_or_none(_device_path(plan.namespace, member.name))
                if current is None:
                    raise Refused(refusals.device_deleted_meanwhile(plan.namespace, member.name)) from None
                attached = devices.attachment(current)
                if attached is not None and attached.vmi and attached.vmi != plan.vmi:
                    raise Refused(refusals.device_just_attached(plan.namespace, member.name,
                                                                vmi=attached.vmi)) from None
                if meta.deleting(current):
                    raise Refused(refusals.device_deleting(plan.namespace, member.name)) from None
                version = meta.resource_version(current)
            except errors.NotFound:
                raise Refused(refusals.device_deleted_meanwhile(plan.namespace, member.name)) from None
            except errors.ApiError as error:
                raise Refused(refusals.attach_refused(plan.namespace, member.name, vmi=plan.vmi,
                                                      problem=error.message)) from None
        raise Refused(refusals.device_kept_changing(plan.namespace, member.name, vmi=plan.vmi))

    async def undo(self, request_id: str, cache: Cache) -> None:
        """Take back this start's writes; what another request took over meanwhile is left alone.

        Waits first for every write still running (none is cancelled), so all
        that was written is known; then clears and deletes concurrently.
        """
        self._stopped = True
        if self._pending:
            await asyncio.wait(set(self._pending))
            self._pending.clear()
        created = dict(self.created)
        detach = [name for name in dict.fromkeys(self.attached) if name not in created]

        async def bounded(step: Awaitable[None]) -> None:
            async with self._limit:
                try:
                    await step
                except Exception as error:  # one step's failure must not stop the others
                    _log.error("an undo step of a refused start failed", request=request_id, error=str(error))

        steps = [*(self._detach(name, request_id, cache) for name in detach),
                 *(self._delete(name, uid) for name, uid in created.items())]
        if steps:
            await asyncio.wait({asyncio.create_task(bounded(step)) for step in steps})
        self.attached.clear()
        self.created.clear()

    async def _delete(self, name: str, uid: str) -> None:
        path = _device_path(self._plan.namespace, name)
        try:
            gone = await self._client.delete(path, uid=uid)
            # This start created the device with its finalizer and, refused, runs no VMI on it: nothing uses
            # it, so the finalizer goes at once, on the version the delete left (a binder that wrote the
            # device meanwhile moved that version, and its own finalizer work decides instead).
            finalizers = meta.finalizers(gone)
            if keys.DEVICE_FINALIZER in finalizers:
                await self._client.merge_patch(
                    path, {"metadata": {"finalizers": [f for f in finalizers if f != keys.DEVICE_FINALIZER]}},
                    resource_version=meta.resource_version(gone))
        except (errors.NotFound, errors.Conflict):
            pass
        except errors.KubeError as error:
            _log.error("could not delete a template device of a refused start", device=name, error=str(error))

    async def _detach(self, name: str, request_id: str, cache: Cache) -> None:
        plan = self._plan
        path = _device_path(plan.namespace, name)
        current: Mapping[str, Any] | None = None
        with contextlib.suppress(CacheError):
            current = cache.store(specs.GPU_DEVICES).get(plan.namespace, name)
        for _ in range(ATTEMPTS):
            if not _requested(current, request_id):
                current = await self._client.get_or_none(path)
            if current is None or not _requested(current, request_id):
                return  # gone, or another request's now
            try:
                await self._client.merge_patch(f"{path}/status", {"status": {"attachment": None, "bindRequest": None}},
                                               resource_version=meta.resource_version(current))
                return
            except errors.Conflict:
                current = None
            except errors.NotFound:
                return
            except errors.KubeError as error:
                _log.error("could not undo an attachment of a refused start", device=name, error=str(error))
                return
        _log.error("gave up undoing an attachment that kept changing", device=name, request=request_id)

