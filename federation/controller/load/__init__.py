"""Measured load: reading it (``reader``), weighing it (``weights``), tracking it (``tracker``)
and turning it into plans (``policy``); weights reach the assignment only through a plan."""
