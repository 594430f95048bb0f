"""Sizing from measured costs: the series a fleet makes (``series``), the fitted costs of a
Prometheus per series and per sample/s (``costs``, data in ``costs.yaml`` written by
``gpufed bench costs``), and what a spec and a fleet need per component (``model``)."""
