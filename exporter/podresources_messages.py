"""Message classes for kubelet's pod-resources v1 API, built at import from the committed .proto.

Why not committed `_pb2` modules: generated code pins the protoc that made it to a
protobuf runtime range, and gpufed's lock moves protobuf on its own; a descriptor built
here from `podresources_v1.proto` works with any protobuf 4+ and needs no protoc
(grpcio-tools) in the lock. The parser reads only what that file uses: proto3 messages
of scalar, message and repeated fields, one per line. Needs the `podresources` extra.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO = Path(__file__).with_name("podresources_v1.proto")
PACKAGE = "v1"
_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
}
_MESSAGE = re.compile(r"^message\s+(\w+)\s*\{(.*?)\}", re.M | re.S)
_FIELD = re.compile(r"^\s*(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;", re.M)
_RPC = re.compile(r"rpc\s+(\w+)\((\w+)\)\s+returns\s+\((\w+)\)")


def file_descriptor(text: str) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of the committed .proto text."""
    fdp = descriptor_pb2.FileDescriptorProto(name="podresources_v1.proto", package=PACKAGE, syntax="proto3")
    label = descriptor_pb2.FieldDescriptorProto
    for name, body in _MESSAGE.findall(text):
        message = fdp.message_type.add(name=name)
        for repeated, kind, field, number in _FIELD.findall(body):
            entry = message.field.add(name=field, number=int(number),
                                      label=label.LABEL_REPEATED if repeated else label.LABEL_OPTIONAL)
            if kind in _SCALARS:
                entry.type = _SCALARS[kind]
            else:
                entry.type, entry.type_name = label.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    return fdp


def rpcs(text: str) -> dict[str, tuple[str, str]]:
    """Method name -> (request message, response message) of the PodResourcesLister service."""
    return {name: (req, resp) for name, req, resp in _RPC.findall(text)}


_TEXT = PROTO.read_text(encoding="utf-8")
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(file_descriptor(_TEXT))
SERVICE = f"/{PACKAGE}.PodResourcesLister/"
RPCS = rpcs(_TEXT)


def message(name: str) -> Any:
    """The generated class of message `name` (e.g. "ListPodResourcesResponse")."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
