"""What the host running the tests has, as pytest markers."""

from __future__ import annotations

import pytest

from host.devices import discover

HAS_GPU = bool(discover().gpus)

cpu_host_only = pytest.mark.skipif(
    HAS_GPU,
    reason="checks the path of a host without NVIDIA GPUs; this host has one "
    "(its devices are covered by the recorded topologies and `mmq devices`)",
)
