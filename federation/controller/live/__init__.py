"""The live route of a change, one stage per module, in the order data flows:

``inbox`` (the one worker thread: sources push into the reconcile loop, it wakes and takes a
``sharder.step.Step``) -> ``place`` (the state that step makes: hand-overs, audit) ->
commit (``stores.store.StateStore.apply``: state, set deltas, audit, fenced, one call) ->
``publish`` (the HTTP SD snapshot in ``sdcache``, then metrics, then file_sd lists in
``filesd`` or the config bundle through ``publisher``). ``children``, ``probe``,
``settling`` and ``handover`` serve the hand-overs that make a move make-before-break.
"""
