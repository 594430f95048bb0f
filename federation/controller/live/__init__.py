"""The live route of a change, one stage per module, in the order data flows."""
