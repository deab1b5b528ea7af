"""The typed API floor: the one place behaviour code goes through to read an object's JSON or to build a write.

- ``meta``: an object's metadata (name, namespace, key, resourceVersion,
  generation, finalizers, deletion, labels, owners) and its ``spec`` and
  ``status`` sections, read without a ``KeyError`` whatever a client wrote;
- ``times``: RFC 3339 in and out (one format for every timestamp we write);
- ``conditions``: one condition merge (a transition time moves only when the
  status does; ``observedGeneration`` when the caller knows it) and one
  comparison;
- ``admission``: an AdmissionReview's request, read once, and its response;
- ``kubevirt``, ``pods``, ``scheduling``, ``device_refs``,
  ``admission_devices``, ``leases``: what the webhooks read of a VMI, a
  launcher pod, their scheduling fields, the device-refs annotation, a
  GPUDevice and the leader's Lease;
- ``values``: a JSON value as the type a reader expects, never walked;
- ``devices``: a GPUDevice's status and spec as the binder reads them, and
  the status patches of placement (``Placement``, ``BindAnswer``);
- ``classes``: what the binder reads of a GPUClass;
- ``workloads``: Cozystack's usage records (Workload, WorkloadMonitor),
  built and compared;
- ``events``: a core/v1 Event about an object;
- ``claims``: the ResourceClaim that holds a DRA-sourced GPUDevice, and its
  allocation (docs/dra.md);
- ``apistatus``: the causes of a refused request's ``metav1.Status``.

The model's typed views are built from JSON in ``cozygpu.views.decode``;
``binder/`` and ``admission/`` read raw JSON only through these modules
(``tests/api/test_floor.py`` keeps it so).
"""
