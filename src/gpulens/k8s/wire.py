"""Just enough of the protobuf wire format to read the kubelet's pod-resources List reply, so the agent
needs grpcio but no generated code (and no protobuf runtime whose version must match that code).
Field numbers are those of podresources_v1.proto; unknown fields are skipped, as protobuf does."""

from __future__ import annotations

from collections.abc import Iterator

from gpulens.errors import BackendUnavailableError

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(BackendUnavailableError):
    """A reply that is not the protobuf it should be."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise WireError("A pod-resources reply ended inside a number.")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise WireError("A pod-resources reply holds a number longer than 64 bits.")


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: an int for varints and fixed-width fields, bytes for
    length-delimited ones (strings, nested messages, packed repeated numbers)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            v, i = _varint(buf, i)
            yield number, v
        elif wire_type == _LEN:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise WireError("A pod-resources reply ended inside a field.")
            yield number, buf[i:i + n]
            i += n
        elif wire_type in (_I64, _I32):
            width = 8 if wire_type == _I64 else 4
            yield number, int.from_bytes(buf[i:i + width], "little")
            i += width
        else:
            raise WireError(f"A pod-resources reply uses protobuf wire type {wire_type}, which it never should.")


def _text(v: int | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else ""


def decode_list_response(buf: bytes) -> list[tuple[str, str, str, str, list[str]]]:
    """ListPodResourcesResponse -> (namespace, pod, container, resource name, device ids) per device group."""
    out = []
    for n, pod in fields(buf):
        if n != 1 or not isinstance(pod, bytes):
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for pn, pv in fields(pod):
            if pn == 1:
                name = _text(pv)
            elif pn == 2:
                namespace = _text(pv)
            elif pn == 3 and isinstance(pv, bytes):
                containers.append(pv)
        for c in containers:
            cname = ""
            groups: list[bytes] = []
            for cn, cv in fields(c):
                if cn == 1:
                    cname = _text(cv)
                elif cn == 2 and isinstance(cv, bytes):
                    groups.append(cv)
            for g in groups:
                resource, ids = "", []
                for gn, gv in fields(g):
                    if gn == 1:
                        resource = _text(gv)
                    elif gn == 2:
                        ids.append(_text(gv))
                out.append((namespace, name, cname, resource, ids))
    return out
