"""Measured load: reading it (``reader``), weighing it (``weighing``), tracking it (``tracking``)
and turning it into plans (``policy``); weights reach the assignment only through a plan."""
