"""The master tier's renderers and the one render pipeline (``pipeline``: ``gpufed render``
and ``plan``, and the controller's config endpoints): the master Prometheus (``render``),
meta-monitoring, freshness records, compose, and the format checks of a bundle."""
