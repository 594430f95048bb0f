"""The load reader against a stand-in answering the Prometheus query API format.

The stand-in keeps raw series (with the ``shard``/``replica`` external labels children
add) and evaluates exactly the one query shape the reader sends,
``max by (job, instance, node) (<metric>{job=~"a|b"})``, refusing anything else with the
error body Prometheus gives (``status: error``, ``errorType: bad_data``). The real
Prometheus 2.42 answers the same query in ``test_load_balance_e2e.py``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import httpx
import pytest

from federation.controller.load.reader import DURATION, SAMPLES, PrometheusLoadReader
from federation.controller.load.weighing import Observation

QUERY = re.compile(r'^max by \(job, instance, node\) \((\w+)(?:\{job=~"([a-z0-9|-]+)"\})?\)$')


class PromStandIn:
    def __init__(self, series: list[tuple[dict[str, str], float]]) -> None:
        self.series = series
        self.queries: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/api/v1/query":
            return httpx.Response(404, text="404 page not found")
        query = request.url.params.get("query", "")
        self.queries.append(query)
        match = QUERY.match(query)
        if match is None:
            return httpx.Response(
                400, json={"status": "error", "errorType": "bad_data", "error": "parse error"}
            )
        metric, jobs = match.group(1), match.group(2)
        allowed = set(jobs.split("|")) if jobs else None
        groups: dict[tuple[str, str, str], float] = {}
        for labels, value in self.series:
            if labels["__name__"] != metric or (allowed is not None and labels.get("job") not in allowed):
                continue
            key = (labels.get("job", ""), labels.get("instance", ""), labels.get("node", ""))
            groups[key] = max(value, groups.get(key, value))
        result = [
            {
                "metric": {k: v for k, v in zip(("job", "instance", "node"), key, strict=True) if v},
                "value": [1700000000.5, _text(value)],
            }
            for key, value in sorted(groups.items())
        ]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )


def _text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value == math.inf else repr(value)


def series(
    metric: str, job: str, instance: str, node: str, value: float, **extra: str
) -> tuple[dict[str, str], float]:
    return {"__name__": metric, "job": job, "instance": instance, "node": node, **extra}, value


def reader_for(*servers: tuple[str, Any], jobs: tuple[str, ...] = ("gpu", "node")) -> PrometheusLoadReader:
    routes = dict(servers)

    def handler(request: httpx.Request) -> httpx.Response:
        answer = routes.get(f"{request.url.scheme}://{request.url.host}:{request.url.port}")
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        response: httpx.Response = answer(request)
        return response

    return PrometheusLoadReader(httpx.Client(transport=httpx.MockTransport(handler)), jobs=jobs)


MASTER = "http://master:9090"


def test_reads_samples_and_durations_per_job_instance_and_node() -> None:
    stand_in = PromStandIn(
        [
            series(SAMPLES, "gpu", "10.0.0.1:9400", "n1", 215.0, shard="r1-0", replica="0"),
            series(SAMPLES, "gpu", "10.0.0.1:9400", "n1", 214.0, shard="r1-0", replica="1"),  # HA pair
            series(DURATION, "gpu", "10.0.0.1:9400", "n1", 0.012, shard="r1-0", replica="0"),
            series(SAMPLES, "node", "10.0.0.1:9100", "n1", 900.0, shard="r1-1"),
            series(SAMPLES, "other", "10.0.0.9:80", "x", 5.0),
        ]
    )
    observed = reader_for((MASTER, stand_in)).read([MASTER])
    assert observed == {
        ("gpu", "10.0.0.1:9400", "n1"): Observation(samples=215.0, duration_s=0.012),
        ("node", "10.0.0.1:9100", "n1"): Observation(samples=900.0, duration_s=None),
    }
    assert stand_in.queries == [
        f'max by (job, instance, node) ({SAMPLES}{{job=~"gpu|node"}})',
        f'max by (job, instance, node) ({DURATION}{{job=~"gpu|node"}})',
    ]


def test_a_target_in_hand_over_on_two_children_counts_once_at_the_larger_reading() -> None:
    a = PromStandIn([series(SAMPLES, "gpu", "h:1", "n1", 100.0), series(SAMPLES, "gpu", "h:2", "n2", 7.0)])
    b = PromStandIn([series(SAMPLES, "gpu", "h:1", "n1", 120.0)])
    observed = reader_for(("http://c0:9090", a), ("http://c1:9090", b)).read(
        ["http://c0:9090", "http://c1:9090"]
    )
    assert observed is not None
    assert {k: v.samples for k, v in observed.items()} == {
        ("gpu", "h:1", "n1"): 120.0,
        ("gpu", "h:2", "n2"): 7.0,
    }


def test_a_server_that_fails_is_skipped_and_none_answering_is_unknown() -> None:
    good = PromStandIn([series(SAMPLES, "gpu", "h:1", "n1", 10.0)])
    reader = reader_for(("http://good:9090", good), ("http://broken:9090", lambda r: httpx.Response(503)))
    observed = reader.read(["http://down:9090", "http://broken:9090", "http://good:9090"])
    assert observed is not None and set(observed) == {("gpu", "h:1", "n1")}
    assert reader.read(["http://down:9090", "http://broken:9090"]) is None
    assert reader.read([]) is None


def test_an_empty_answer_is_a_reading_of_nothing_not_unknown() -> None:
    assert reader_for((MASTER, PromStandIn([])), jobs=()).read([MASTER]) == {}


@pytest.mark.parametrize(
    "body",
    [
        {"status": "error", "errorType": "execution", "error": "query timed out"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        {"status": "success"},
        ["not", "an", "object"],
    ],
)
def test_answers_that_are_not_an_instant_vector_are_unknown(body: Any) -> None:
    reader = reader_for((MASTER, lambda r: httpx.Response(200, json=body)))
    assert reader.read([MASTER]) is None


def test_malformed_samples_are_skipped_one_by_one() -> None:
    result = [
        {"metric": {"job": "gpu", "instance": "h:1", "node": "n1"}, "value": [1.0, "12"]},
        {"metric": {"job": "gpu", "instance": "h:2", "node": "n2"}, "value": [1.0, "NaN"]},
        {"metric": {"job": "gpu", "instance": "h:3", "node": "n3"}, "value": [1.0, "+Inf"]},
        {"metric": {"job": "gpu", "instance": "h:4", "node": "n4"}, "value": [1.0, "twelve"]},
        {"metric": {"job": "gpu", "instance": "h:5", "node": "n5"}, "value": "12"},
        {"metric": "job", "value": [1.0, "12"]},
        "junk",
        {"metric": {"job": "gpu", "instance": "h:6"}, "value": [1.0, "3"]},  # no node label
    ]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    reader = reader_for((MASTER, lambda r: httpx.Response(200, content=json.dumps(body).encode())))
    observed = reader.read([MASTER])
    assert observed is not None
    assert {k: v.samples for k, v in observed.items()} == {
        ("gpu", "h:1", "n1"): 12.0,
        ("gpu", "h:6", ""): 3.0,
    }


def test_a_body_that_is_not_json_is_unknown() -> None:
    reader = reader_for((MASTER, lambda r: httpx.Response(200, content=b"<html>proxy error</html>")))
    assert reader.read([MASTER]) is None
