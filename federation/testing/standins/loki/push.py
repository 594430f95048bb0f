"""A stand-in for Loki's push endpoint, ``POST /loki/api/v1/push``, that checks labels.

It follows Loki's documented push API (docs: "Loki HTTP API", ``POST /loki/api/v1/push``;
grafana/loki pkg/loghttp/push/push.go): ``Content-Type: application/json`` bodies are
``{"streams": [{"stream": {label: value}, "values": [["<unix ns>", "<line>"], ...]}]}``
(optionally gzip-encoded); any other content type is a snappy-compressed protobuf
``logproto.PushRequest`` (grafana/loki pkg/push/push.proto@01a3f3fa: ``streams`` = 1, each
a ``StreamAdapter`` with ``labels`` = 1 as a Prometheus label string and ``entries`` = 2 of
``EntryAdapter`` {``timestamp`` = 1, ``line`` = 2}). That is what Promtail sends.

Refused with 400 as Loki's distributor refuses them (pkg/distributor/validator.go): labels
that do not parse, a stream without labels, a duplicate or invalid label name, an empty
value, more than ``max_label_names`` names; plus, as this stand-in's own check, a stream
missing one of ``required`` labels. Accepted pushes answer 204 and are kept in ``streams``.
Binds 127.0.0.1 on a free port.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from federation.localrun.loopback import LOOPBACK, LoopbackHandler, LoopbackHTTPServer
from federation.testing.standins.loki import snappy

PUSH_PATH = "/loki/api/v1/push"
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def _messages() -> dict[str, Any]:
    """PushRequest and friends built from a descriptor (no protoc, as exporter.podresources_messages)."""
    field_type = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="gpufed_logproto_push.proto",
        package="logproto",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )

    def add(message: str, *fields: tuple[str, int, int, bool, str]) -> None:
        entry = fdp.message_type.add(name=message)
        for name, number, kind, repeated, type_name in fields:
            spec = entry.field.add(
                name=name,
                number=number,
                type=kind,
                label=field_type.LABEL_REPEATED if repeated else field_type.LABEL_OPTIONAL,
            )
            if type_name:
                spec.type_name = type_name

    msg, string, uint64 = field_type.TYPE_MESSAGE, field_type.TYPE_STRING, field_type.TYPE_UINT64
    add("LabelPairAdapter", ("name", 1, string, False, ""), ("value", 2, string, False, ""))
    add(
        "EntryAdapter",
        ("timestamp", 1, msg, False, ".google.protobuf.Timestamp"),
        ("line", 2, string, False, ""),
        ("structuredMetadata", 3, msg, True, ".logproto.LabelPairAdapter"),
    )
    add(
        "StreamAdapter",
        ("labels", 1, string, False, ""),
        ("entries", 2, msg, True, ".logproto.EntryAdapter"),
        ("hash", 3, uint64, False, ""),
    )
    add("PushRequest", ("streams", 1, msg, True, ".logproto.StreamAdapter"), ("format", 2, string, False, ""))
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"logproto.{name}"))
        for name in ("PushRequest", "StreamAdapter", "EntryAdapter")
    }


MESSAGES = _messages()


def parse_labels(text: str) -> list[tuple[str, str]]:
    """``{a="b", c="d"}`` -> pairs in order; ValueError when it does not parse."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"labels must be {{...}}: {text!r}")
    body, pairs, pos = body[1:-1], [], 0
    while pos < len(body.strip()):
        match = _PAIR.match(body, pos)
        if match is None:
            raise ValueError(f"bad label pair at {body[pos:]!r}")
        pairs.append((match[1], json.loads(f'"{match[2]}"')))
        pos = match.end()
    return pairs


def label_string(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def encode_protobuf(streams: list[tuple[dict[str, str], list[tuple[int, str]]]]) -> bytes:
    """What Promtail posts: snappy(PushRequest) with ``labels`` as a label string."""
    request = MESSAGES["PushRequest"]()
    for labels, entries in streams:
        stream = request.streams.add(labels=label_string(labels))
        for ns, line in entries:
            entry = stream.entries.add(line=line)
            entry.timestamp.seconds, entry.timestamp.nanos = divmod(ns, 1_000_000_000)
    return snappy.compress(request.SerializeToString())


def encode_json(streams: list[tuple[dict[str, str], list[tuple[int, str]]]]) -> bytes:
    return json.dumps(
        {
            "streams": [
                {"stream": labels, "values": [[str(ns), line] for ns, line in entries]}
                for labels, entries in streams
            ]
        }
    ).encode()


@dataclass
class Received:
    labels: dict[str, str]
    entries: list[tuple[int, str]]
    encoding: str


@dataclass
class LokiPushStandIn:
    required: tuple[str, ...] = ()
    max_label_names: int = 15
    streams: list[Received] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    host: str = LOOPBACK
    port: int = 0

    def __post_init__(self) -> None:
        stand_in = self

        class Handler(LoopbackHandler):
            def do_GET(self) -> None:
                """``/ready`` as Loki answers it once it serves (the compose runner's health probe)."""
                if self.path == "/ready":
                    self.reply(200, "ready\n")
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                status, reason = stand_in.handle(
                    self.path,
                    self.headers.get("Content-Type", ""),
                    self.headers.get("Content-Encoding", ""),
                    self.body(),
                )
                self.reply(status, reason)

        self._server = LoopbackHTTPServer(Handler, host=self.host, port=self.port, name="loki-push")

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> LokiPushStandIn:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def handle(self, path: str, content_type: str, encoding: str, body: bytes) -> tuple[int, str]:
        if path != PUSH_PATH:
            return 404, "404 page not found\n"
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            received = (
                self._json(body)
                if content_type.split(";")[0].strip() == "application/json"
                else self._protobuf(body)
            )
            for stream in received:
                self._validate(stream.labels)
        except (ValueError, snappy.SnappyError) as exc:
            self.rejected.append((400, str(exc)))
            return 400, f"{exc}\n"
        self.streams += received
        return 204, ""

    def _json(self, body: bytes) -> list[Received]:
        data = json.loads(body)
        out = []
        for stream in data["streams"]:
            labels = stream.get("stream") or {}
            if not all(isinstance(v, str) for v in labels.values()):
                raise ValueError("stream label values are strings")
            out.append(Received(dict(labels), [(int(ts), line) for ts, line, *_ in stream["values"]], "json"))
        return out

    def _protobuf(self, body: bytes) -> list[Received]:
        request = MESSAGES["PushRequest"].FromString(snappy.decompress(body))
        out = []
        for stream in request.streams:
            pairs = parse_labels(stream.labels)
            names = [name for name, _ in pairs]
            if len(set(names)) != len(names):
                raise ValueError(f"duplicate label name in {stream.labels}")
            entries = [
                (e.timestamp.seconds * 1_000_000_000 + e.timestamp.nanos, e.line) for e in stream.entries
            ]
            out.append(Received(dict(pairs), entries, "protobuf"))
        return out

    def _validate(self, labels: dict[str, str]) -> None:
        if not labels:
            raise ValueError("error at least one label pair is required per stream")
        if len(labels) > self.max_label_names:
            raise ValueError(f"stream has {len(labels)} label names, more than {self.max_label_names}")
        for name, value in labels.items():
            if not _NAME.match(name) or name.startswith("__"):
                raise ValueError(f"invalid label name {name!r}")
            if not value:
                raise ValueError(f"label {name!r} has an empty value")
        missing = [name for name in self.required if name not in labels]
        if missing:
            raise ValueError(f"stream {label_string(labels)} lacks the labels {missing}")


def main(argv: list[str] | None = None) -> None:
    """Run the push stand-in as its own process (the compose runner's ``loki``): serves until killed."""
    import argparse
    import threading

    parser = argparse.ArgumentParser(description="Loki push API stand-in")
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    stand_in = LokiPushStandIn(host=args.host, port=args.port).__enter__()
    print(stand_in.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
