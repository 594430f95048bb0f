"""The push path once: what the rendered Promtail config sends, as Loki's push API receives it.

Promtail cannot run here. The test computes what it would send for one GPU node of the
example inventory, from the rendered ``logs/promtail.yml`` itself: the node's environment
expanded as ``-config.expand-env`` does, the journal target's discovered labels relabelled
by the rendered ``relabel_configs`` (``federation.testing.standins.loki.relabel``), the XID
regex stage applied. It then pushes a kernel XID line as Promtail does (protobuf + snappy)
and a container line as JSON to ``federation.testing.standins.loki.push.LokiPushStandIn``,
which follows Loki's documented push API and refuses what Loki's distributor refuses.
The labels that arrive must be the node's metric labels (cluster, node, region, rack, team).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml

from federation.master.pipeline import load_inputs, logs_part
from federation.testing.standins.loki import push, snappy
from federation.testing.standins.loki.relabel import relabel
from logs import promtail
from logs.models import LogsSpec

ROOT = Path(__file__).resolve().parents[2]
XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2291, GPU has fallen off the bus."
NS = 1_714_556_700_000_000_000

# golang/snappy snappy_test.go@03ee571c: TestDecode and TestWriterGoldenOutput's block payload
SNAPPY_VECTORS = [
    (b"\x00", b""),
    (b"\x03\x08\xff\xff\xff", b"\xff\xff\xff"),
    (b"\x03\xf0\x02\xff\xff\xff", b"\xff\xff\xff"),
    (b"\x03\xf4\x02\x00\xff\xff\xff", b"\xff\xff\xff"),
    (b"\x04\x0cabcd", b"abcd"),
    (b"\x0d\x0cabcd\x15\x04", b"abcdabcdabcda"),
    (b"\x08\x0cabcd\x01\x01", b"abcddddd"),
    (b"\x06\x0cabcd\x06\x03\x00", b"abcdbc"),
    (b"\x64\x00\x41\xfe\x01\x00\x8a\x01\x00", b"A" * 100),
]
SNAPPY_CORRUPT = [
    b"\x03\x08\xff\xff",
    b"\x08\x0cabcd\x01\x00",
    b"\x09\x0cabcd\x01\x04",
    b"\x08\x0cabcd\x01\x05",
    b"\xff",
]


@pytest.mark.parametrize(("encoded", "decoded"), SNAPPY_VECTORS)
def test_snappy_reads_the_reference_vectors(encoded: bytes, decoded: bytes) -> None:
    assert snappy.decompress(encoded) == decoded
    assert snappy.decompress(snappy.compress(decoded)) == decoded


@pytest.mark.parametrize("encoded", SNAPPY_CORRUPT)
def test_snappy_refuses_corrupt_blocks(encoded: bytes) -> None:
    with pytest.raises(snappy.SnappyError):
        snappy.decompress(encoded)


def expand_env(text: str, env: dict[str, str]) -> str:
    """Promtail's -config.expand-env: ${VAR} and ${VAR:-default}."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m[1]) or (m[2] or ""), text)


def test_the_rendered_config_pushes_the_nodes_metric_labels() -> None:
    spec, targets = load_inputs(ROOT / "examples" / "federation.yaml", ROOT / "examples" / "inventory.yaml")
    node = next(t for t in targets if t.job == "gpu" and t.rack and t.team)
    metric_labels = {
        "cluster": spec.cluster,
        "node": node.node,
        "region": node.region,
        "rack": node.rack,
        "team": node.team,
    }
    rendered = logs_part(spec, targets, None)[promtail.CONFIG_FILE].decode()  # type: ignore[arg-type]
    with push.LokiPushStandIn(required=("cluster", "node", "region", "job")) as loki:
        env = {
            "NODE_NAME": node.node,
            "GPUFED_REGION": node.region,
            "GPUFED_RACK": node.rack,
            "GPUFED_TEAM": node.team,
            "GPUFED_LOKI_URL": loki.url,
        }
        config = yaml.safe_load(expand_env(rendered, env))
        url = config["clients"][0]["url"]
        assert url == f"{loki.url}{push.PUSH_PATH}"
        jobs = {job["job_name"]: job for job in config["scrape_configs"]}

        # a kernel XID line from the journal: discovered labels -> relabel -> the XID stage
        journal = jobs["journal"]
        discovered = {
            **journal["journal"]["labels"],
            "__journal__transport": "kernel",
            "__journal_priority_keyword": "warning",
        }
        kernel = relabel(discovered, journal["relabel_configs"])
        assert kernel is not None
        stage = journal["pipeline_stages"][0]["match"]["stages"]
        extracted = re.search(stage[0]["regex"]["expression"], XID_LINE)
        assert extracted is not None
        kernel |= {name: extracted[name] for name in stage[1]["labels"]}
        # a unit outside the list is dropped by the keep rule
        assert (
            relabel(
                {**discovered, "__journal__transport": "journal", "__journal__systemd_unit": "cron.service"},
                journal["relabel_configs"],
            )
            is None
        )
        # a container line
        docker = jobs["docker"]
        container = relabel(docker["static_configs"][0]["labels"], docker["relabel_configs"])
        assert container is not None

        with httpx.Client(timeout=5) as client:
            sent = client.post(
                url,
                content=push.encode_protobuf([(kernel, [(NS, XID_LINE)])]),
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert sent.status_code == 204, sent.text
            sent = client.post(
                url,
                content=push.encode_json([(container, [(NS + 1, "step 100 loss 1.9")])]),
                headers={"Content-Type": "application/json"},
            )
            assert sent.status_code == 204, sent.text
        assert [s.encoding for s in loki.streams] == ["protobuf", "json"]
        received = loki.streams[0]
        assert received.labels == {
            **metric_labels,
            "job": "journal",
            "unit": "kernel",
            "level": "warning",
            "xid": "79",
        }
        assert received.entries == [(NS, XID_LINE)]
        assert loki.streams[1].labels == {**metric_labels, "job": "containers"}


def test_a_node_without_rack_sends_no_empty_label() -> None:
    """Relabelling drops an empty identity label; Loki would refuse the empty value."""
    rules = promtail.promtail_config(LogsSpec(), cluster="c")
    text = expand_env(yaml.safe_dump(rules), {"NODE_NAME": "n1", "GPUFED_REGION": "r1"})
    job = yaml.safe_load(text)["scrape_configs"][1]
    labels = relabel(job["static_configs"][0]["labels"], job["relabel_configs"])
    assert labels == {"cluster": "c", "node": "n1", "region": "r1", "job": "containers"}
    with push.LokiPushStandIn() as loki, httpx.Client(timeout=5) as client:
        url = f"{loki.url}{push.PUSH_PATH}"
        assert (
            client.post(
                url,
                content=push.encode_json([(labels, [(NS, "x")])]),
                headers={"Content-Type": "application/json"},
            ).status_code
            == 204
        )
        empty = client.post(
            url,
            content=push.encode_json([({**labels, "rack": ""}, [(NS, "x")])]),
            headers={"Content-Type": "application/json"},
        )
        assert empty.status_code == 400 and "empty value" in empty.text
        bare = client.post(
            url,
            content=push.encode_protobuf([({}, [(NS, "x")])]),
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert bare.status_code == 400 and "at least one label" in bare.text
        assert [s.labels for s in loki.streams] == [labels]
