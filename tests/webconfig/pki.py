"""The tests' private CA: ``webconfig.testing`` (the TLS benches use it too)."""

from webconfig.testing import Leaf, Pki

__all__ = ["Leaf", "Pki"]
