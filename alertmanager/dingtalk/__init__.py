"""DingTalk relay: Alertmanager webhook (version 4) -> DingTalk custom robots.

Pipeline: ``payload`` (validated webhook) -> ``dedup`` -> ``render``/``split`` (markdown
parts under the byte limit) -> ``sender`` (per-robot rate limit, queue, merging) ->
``client`` (signed HTTP call, DingTalk error codes mapped to transient/permanent).
``app`` wires this into FastAPI; ``cli`` runs it under uvicorn.
"""
