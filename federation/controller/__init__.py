"""The live control plane behind ``gpufed serve``.

Where a registration becomes an SD answer, in order (details in ``controller.py``):
``api`` (PUT/POST /v1/registry) -> ``sharder.sources.registry`` (validate, push a delta) ->
``sharder.reconcile.Reconciler`` (debounce, grace, incremental placement with the
operator's overrides as data) -> ``controller.Controller._on_discovery`` (hand-overs,
commit to the ``store``, fenced) -> ``publication.Publication.publish`` (``sdcache``
snapshot swapped in) -> ``api`` answers ``/v1/sd/<child>`` from that snapshot.

Rooms, top to bottom (the ``controller-layers`` contract in ``.importlinter``):
``service`` (composition of the app) > ``api`` (thin routes) > ``controller`` (the façade
that wires everything, the one lock, commit) > ``replica``, ``load_policy`` > ``plans``,
``views``, ``publication`` > ``children``, ``sdcache``, ``publisher``, ``load`` >
``handover``, ``changes``, ``store``, ``probe``, ``options``, ``errors`` > ``state``.
"""
