"""Typed alerting spec (the ``alerting`` section of federation.yaml).

Placeholder shape; the alerting issue fills it in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class AlertingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
