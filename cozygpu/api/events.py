"""A core/v1 Event about one object (the legacy shape ``kubectl describe`` lists), as cozygpu raises it; pure."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import attrs

from cozygpu.api.times import rfc3339

#: The longest message an Event carries (the API server refuses a longer one).
MESSAGE_LIMIT: Final = 1024


@attrs.frozen(kw_only=True)
class Involved:
    """The object an Event is about, at the resourceVersion the Event names."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: str

    def as_json(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name,
                "uid": self.uid, "resourceVersion": self.resource_version}


@attrs.frozen(kw_only=True)
class Event:
    """One Event: ``name`` is its own (unique) name, in the namespace of the object it is about."""

    name: str
    involved: Involved
    type: str
    reason: str
    message: str
    component: str
    instance: str
    time: datetime

    @property
    def namespace(self) -> str:
        return self.involved.namespace

    def as_json(self) -> dict[str, Any]:
        stamp = rfc3339(self.time)
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"namespace": self.namespace, "name": self.name},
            "involvedObject": self.involved.as_json(),
            "type": self.type, "reason": self.reason, "message": self.message[:MESSAGE_LIMIT],
            "source": {"component": self.component}, "reportingComponent": self.component,
            "reportingInstance": self.instance, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
