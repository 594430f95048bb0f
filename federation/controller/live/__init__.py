"""The live route of a change, one stage per module, in the order data flows:

``inbox`` (when the one worker thread, ``federation.controller.loop``, wakes: sources push
into the reconcile loop) -> ``route`` (carries the reconciler's ``sharder.engine.step.Step``
forward) -> ``place`` (the state that step makes: hand-overs, audit) -> commit
(``pipeline``: ``stores.store.StateStore.apply``, state, set deltas, audit, fenced, one
call) -> ``publish`` (the HTTP SD snapshot in ``sdcache``, then metrics, then file_sd lists
in ``filesd`` or the config bundle through ``publisher``). ``children``, ``probe``,
``settling`` and ``handover`` serve the hand-overs that make a move make-before-break.
"""
