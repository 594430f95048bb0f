"""The live control plane behind ``gpufed serve``.

Rooms are folders (``stores/``, ``ha/``, ``http/``, ``load/``, ``live/``) and a few modules
at the root (the façade ``controller``, the wiring ``service``, the plan and read models,
the state model). Their order is written once, as the ``controller-layers`` contract in
``.importlinter``; the route of a change is drawn in ``live/__init__.py`` and in the
README's "Inside the controller".
"""
