"""NVIDIA's XID catalog, as far as alerts need it: what each code means, what to do, how severe.

Sources: NVIDIA's "XID Errors" catalog (docs.nvidia.com/deploy/xid-errors) and the k8s device
plugin, which treats 13, 31, 43, 45 and 68 as application errors that leave the GPU healthy
(REFERENCE.md). Codes that need a reset, a reboot or an RMA are critical.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    action: str
    severity: str  # critical | warning


XID_CATALOG: dict[int, XidInfo] = {
    x.code: x
    for x in (
        XidInfo(13, "graphics engine exception (often an application bug)", "Check the application; the GPU stays healthy.", "warning"),
        XidInfo(31, "GPU memory page fault (often an application bug)", "Check the application for illegal memory access.", "warning"),
        XidInfo(43, "GPU stopped processing (application)", "Restart the application.", "warning"),
        XidInfo(45, "preemptive cleanup after a previous error", "Follow the earlier XID on this GPU.", "warning"),
        XidInfo(48, "double-bit ECC error", "Drain the node and reset the GPU.", "critical"),
        XidInfo(63, "ECC page retirement or row remapping recorded", "Watch it; reset the GPU when convenient to apply the remapping.", "warning"),
        XidInfo(64, "ECC page retirement or row remapping failure", "Reset the GPU; RMA it if this repeats.", "critical"),
        XidInfo(68, "video processor exception", "Restart the application.", "warning"),
        XidInfo(74, "NVLink error", "Check the NVLink connections and reset the GPU.", "critical"),
        XidInfo(79, "GPU has fallen off the bus", "Drain and reboot the node; check power and PCIe seating if it repeats.", "critical"),
        XidInfo(92, "high single-bit ECC error rate", "Watch the corrected ECC rate; plan a reset.", "warning"),
        XidInfo(94, "contained ECC error", "Restart the affected application.", "warning"),
        XidInfo(95, "uncontained ECC error", "Drain the node and reset the GPU.", "critical"),
        XidInfo(119, "GSP RPC timeout", "Reset the GPU; update the driver if this repeats.", "critical"),
        XidInfo(120, "GSP error", "Reset the GPU; update the driver if this repeats.", "critical"),
    )
}

UNKNOWN_XID_SEVERITY = "warning"


def xid_info(code: str | int | None) -> XidInfo:
    try:
        c = int(code)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        c = -1
    return XID_CATALOG.get(c) or XidInfo(c, "XID not in gpulens's catalog", "Look the code up in NVIDIA's XID catalog.", UNKNOWN_XID_SEVERITY)
