"""The API boundary: config and auth, raw JSON requests, watch streams, preconditioned writes.

Everything above this layer talks to Kubernetes through ``Client`` and sees only
the exception tree of ``errors``.
"""

from cozygpu.kube.client import Client, Obj, resource_path

__all__ = ["Client", "Obj", "resource_path"]
