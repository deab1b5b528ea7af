"""cozygpu: GPUs for KubeVirt virtual machines on a multi-tenant Cozystack platform."""

from __future__ import annotations

__version__ = "0.1.0"
