"""Compatibility only: ``federation.controller.bench`` (moved by another branch) still imports
``ControllerOptions`` from here. The controller lives in ``controller.py``; delete this module
once nothing imports it."""

from federation.controller.controller import Controller
from federation.controller.options import ControllerOptions

__all__ = ["Controller", "ControllerOptions"]
