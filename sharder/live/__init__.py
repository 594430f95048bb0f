"""The live loop: sources push into ``reconcile.Reconciler``, which merges their sets,
waits out debounce and grace, and places through the engine. Outside the sharder only the
controller's pipeline and the loop's hosts import it (``live-loop-hosts`` contract)."""
