"""Which host NVSHMEM library can run our device code (docs/design.md, "The GPU wheel and the
one-call run (issue 25)", NVSHMEM versions).

``_nvshmem`` links our copy of ``libnvshmem_device.a``; the build records its NVSHMEM version in
``build_parts.json`` (``extension.nvshmem_built_against``), so the host library found at run time
is checked against it *before* ``_nvshmem`` is imported (``extension.load_nvshmem``): an
incompatible host fails the import with an undefined symbol at best. ``jax-gpuext info`` shows
both versions and the verdict.
"""

from __future__ import annotations

import os

from jax_gpuext.common import libs as _libs

# NVSHMEM 3.5.21's release notes, known issues: "The internal layout of RC-connected QPs changed
# starting in 3.5.19 causing ABI compatibility breakage when enabling IBGDA."
IBGDA_LAYOUT_CHANGE = (3, 5, 19)
IBGDA_ENV = "NVSHMEM_IB_ENABLE_IBGDA"


def _text(v) -> str:
    return ".".join(map(str, v))


def verdict(built: tuple[int, ...] | None, host: tuple[int, ...] | None, *, ibgda: bool = False) -> tuple[bool, str]:
    """Whether device code built against NVSHMEM ``built`` runs with host library ``host``:
    ``(ok, reason)``. NVSHMEM's rule (3.0 release notes; the host library's own check at init,
    ``nvshmemi_is_version_compatible``): within one major version a host library runs device
    libraries of its minor or older; a newer device library may call host functions an older host
    lacks (a 3.8.0 build does not even import against 3.4.5). One known exception: IBGDA between
    a build before 3.5.19 and a host from 3.5.19 on."""
    if built is None:
        return False, "the build did not record which NVSHMEM _nvshmem was built against"
    if host is None:
        return False, "no libnvshmem_host.so.3 was found"
    b, h = _text(built), _text(host)
    if host[0] != built[0]:
        return False, (f"libnvshmem_host {h} cannot run device code built against NVSHMEM {b}: NVSHMEM keeps "
                       f"host and device libraries compatible within one major version only (install "
                       f"nvidia-nvshmem {built[0]}.x, >= {b})")
    if host[1] < built[1]:
        return False, (f"libnvshmem_host {h} is older than NVSHMEM {b}, which _nvshmem was built against: a host "
                       f"library runs device code of its own minor version or older only (install "
                       f"nvidia-nvshmem >= {b})")
    if ibgda and tuple(built) < IBGDA_LAYOUT_CHANGE <= tuple(host):
        return False, (f"{IBGDA_ENV} is set and libnvshmem_host {h} changed IBGDA's queue-pair layout in 3.5.19, "
                       f"after NVSHMEM {b}, which _nvshmem was built against (NVSHMEM 3.5.21 known issues): "
                       "unset it, or use a host library older than 3.5.19")
    return True, f"libnvshmem_host {h} runs device code built against NVSHMEM {b} (same major, host minor >= build's)"


def ibgda_enabled() -> bool:
    return os.environ.get(IBGDA_ENV, "0").strip().lower() not in ("", "0", "false", "no", "n")


def check(built: tuple[int, ...] | None) -> tuple[bool, str]:
    """The verdict for ``built`` against the host library found here."""
    host, _ = _libs.version("nvshmem")
    return verdict(built, host, ibgda=ibgda_enabled())


def report(built: tuple[int, ...] | None, not_built: str | None = None) -> dict:
    """Build-time and host NVSHMEM versions and whether they fit (``jax-gpuext info``); ``not_built``
    is the build record's reason when _nvshmem was left out."""
    host, where = _libs.version("nvshmem")
    ok, reason = verdict(built, host, ibgda=ibgda_enabled())
    if built is None:  # a build without _nvshmem says why; an older one did not record the version
        reason = not_built or reason
    elif host is None:
        reason = where  # where it looked, and what to install
    return {"built_against": None if built is None else _text(built),
            "host": None if host is None else _text(host), "host_where": where,
            "compatible": ok, "reason": reason}
