"""The relay never sends an older state of a group after a newer one (``ordering``).

The case from the field: AM-1 sent ``[RESOLVED:3]``; 0.87 s later the restarted AM-0 sent
``[FIRING:2]`` for the same group and the same alerts (same ``startsAt``). The real HA
pair is driven in ``tests/e2e/test_live_faults.py``; here the relay's rule, through its app.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from alertmanager.dingtalk.ordering import GroupStates
from alertmanager.dingtalk.payload import Alert

from .payloads import alert, webhook
from .test_dingtalk_app import FakeClock, errcodes, metric, post, run

LATER = "2024-05-01T12:00:00Z"


def resolved(i: int) -> dict[str, Any]:
    return alert(i, status="resolved")


def test_firing_after_resolved_of_the_same_alerts_is_dropped_and_counted() -> None:
    sent: list[dict[str, Any]] = []

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        assert (await post(relay, webhook([alert(1), alert(2), alert(3)]))).json()["status"] == "sent"
        ended = webhook([resolved(1), resolved(2), resolved(3)])
        assert (await post(relay, ended)).json()["status"] == "sent"
        late = (await post(relay, webhook([alert(1), alert(2)]))).json()  # the restarted replica
        assert late == {"status": "stale", "robot": "cn-bj", "alerts": 2}
        assert metric(registry, "gpufed_dingtalk_stale_dropped_total") == 1
        assert metric(registry, "gpufed_dingtalk_stale_alerts_dropped_total") == 2
        # Resent by Alertmanager: still stale, never "duplicate" of something DingTalk showed.
        assert (await post(relay, webhook([alert(1), alert(2)]))).json()["status"] in {"stale", "duplicate"}

    run(errcodes(sent=sent), scenario)
    titles = [m["markdown"]["title"] for m in sent]
    assert titles == ["[FIRING:3] GPUXidError cn-bj", "[RESOLVED:3] GPUXidError cn-bj"]


def test_a_new_episode_fires_again_and_a_mixed_message_keeps_only_what_is_newer() -> None:
    sent: list[dict[str, Any]] = []
    clock = FakeClock()

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        await post(relay, webhook([alert(1), alert(2)]))
        await post(relay, webhook([resolved(1), resolved(2)]))
        clock.now += 600  # past the dedup window: the same alert set is not a duplicate
        again = {**alert(1), "startsAt": LATER}  # the same alert, a new fault after the resolve
        mixed = (await post(relay, webhook([again, alert(2)]))).json()
        assert mixed["status"] == "sent" and mixed["alerts"] == 1
        assert metric(registry, "gpufed_dingtalk_stale_alerts_dropped_total") == 1
        assert metric(registry, "gpufed_dingtalk_stale_dropped_total") == 0
        # The end of the older episode after the newer one fired is older too.
        old_end = (await post(relay, webhook([resolved(1)]))).json()
        assert old_end["status"] == "stale"

    run(errcodes(sent=sent), scenario, clock=clock)
    assert [m["markdown"]["title"] for m in sent][-1] == "[FIRING:1] GPUXidError cn-bj"
    assert "node-0001" in sent[-1]["markdown"]["text"] and "node-0002" not in sent[-1]["markdown"]["text"]


def test_groups_and_robots_are_separate_and_memory_expires() -> None:
    now = [0.0]
    states = GroupStates(retention=60, clock=lambda: now[0])
    fired, ended = Alert.model_validate(alert(1)), Alert.model_validate(resolved(1))
    states.record("bj", "g1", [ended])
    assert states.check("bj", "g1", [fired]).stale == (fired,)
    assert states.check("bj", "g2", [fired]).fresh == (fired,)
    assert states.check("sh", "g1", [fired]).fresh == (fired,)
    states.record("bj", "g1", [fired])  # never moves the record back
    assert states.check("bj", "g1", [fired]).stale == (fired,)
    # Replicas stamp their own startsAt on alerts not sent by Prometheus: a few ms apart,
    # still before the recorded end, still the same episode.
    skewed = fired.model_copy(update={"startsAt": fired.startsAt.replace(microsecond=5000)})
    assert states.check("bj", "g1", [skewed]).stale == (skewed,)
    now[0] = 61.0  # a restart, or the retention, forgets: the next message is sent as it is
    assert states.check("bj", "g1", [fired]).fresh == (fired,) and len(states) == 0
