"""Scale-out on Ray (the optional extra ``hyocr[ray]``). ``serve`` runs ``hyocr serve --ray``: the API as a Ray
Serve ingress, the engine as replicas (``replica``), reached through ``engine.RayServeEngine``; ``data`` runs
``hyocr batch --ray`` as a Ray Data pipeline. Ray is imported inside functions only, so hyocr imports without it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Settings

LOCAL = "local"  # ray.init's address for a cluster of its own, started here


def cluster_address(settings: Settings) -> str:
    """The Ray cluster to join: RAY_ADDRESS as a setting or in the environment, else a cluster of its own
    (``local``: never one that `ray start` left running on this machine, which ray.init's default would join)."""
    return settings.ray_address or os.environ.get("RAY_ADDRESS") or LOCAL
