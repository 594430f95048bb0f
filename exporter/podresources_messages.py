"""Message classes for kubelet's pod-resources v1 API, built at import from kubelet's own proto.

`exporter/upstream/kubelet-podresources-v1-api.proto` is kubernetes/kubelet's
`pkg/apis/podresources/v1/api.proto`, unchanged (exporter/upstream/SOURCES.md has the commit
and hash). Why a descriptor built here rather than committed `_pb2` modules: generated code
pins the protoc that made it to a protobuf runtime range, and gpufed's lock moves protobuf
on its own; a descriptor built from the proto text works with any protobuf 4+ and needs no
protoc (grpcio-tools) in the lock. The parser reads what that file uses: comments, `option`
lines, proto3 messages of scalar, message, `repeated` and proto3 `optional` fields, and
one service. Anything else in a future upstream file fails loudly here (a field line the
parser does not understand), not silently in the decoder. Needs the `podresources` extra.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO = Path(__file__).parent / "upstream" / "kubelet-podresources-v1-api.proto"
PACKAGE = "v1"
_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
}
_COMMENT = re.compile(r"//[^\n]*")
_MESSAGE = re.compile(r"^message\s+(\w+)\s*\{(.*?)\}", re.M | re.S)
_FIELD = re.compile(r"^(?:(repeated|optional)\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;$")
_RPC = re.compile(r"rpc\s+(\w+)\((\w+)\)\s+returns\s+\((\w+)\)")


def _strip(text: str) -> str:
    return _COMMENT.sub("", text)


def file_descriptor(text: str) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of the proto text (kubelet's file)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="podresources_v1.proto", package=PACKAGE, syntax="proto3")
    label = descriptor_pb2.FieldDescriptorProto
    for name, body in _MESSAGE.findall(_strip(text)):
        message = fdp.message_type.add(name=name)
        for line in filter(None, (part.strip() for part in body.splitlines())):
            found = _FIELD.match(line)
            if found is None:
                raise ValueError(f"podresources proto: message {name}: cannot read field line {line!r}")
            modifier, kind, field, number = found.groups()
            repeated = label.LABEL_REPEATED if modifier == "repeated" else label.LABEL_OPTIONAL
            entry = message.field.add(name=field, number=int(number), json_name=_camel(field), label=repeated)
            if kind in _SCALARS:
                entry.type = _SCALARS[kind]
            else:
                entry.type, entry.type_name = label.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
            if modifier == "optional":  # proto3 optional: a synthetic oneof, as protoc writes it
                entry.proto3_optional = True
                entry.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{field}")
    return fdp


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def rpcs(text: str) -> dict[str, tuple[str, str]]:
    """Method name -> (request message, response message) of the PodResourcesLister service."""
    return {name: (req, resp) for name, req, resp in _RPC.findall(_strip(text))}


_TEXT = PROTO.read_text(encoding="utf-8")
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(file_descriptor(_TEXT))
SERVICE = f"/{PACKAGE}.PodResourcesLister/"
RPCS = rpcs(_TEXT)


def message(name: str) -> Any:
    """The generated class of message `name` (e.g. "ListPodResourcesResponse")."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
