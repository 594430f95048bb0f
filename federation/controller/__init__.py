"""The live control plane behind ``gpufed serve``.

Rooms are folders (``http/`` with the wiring ``service``, ``load/``, ``ha/``, ``live/``,
``stores/``, and ``base/``: plans, changes, the state model, metrics, options, errors) and
three modules at the root (the façade ``controller``, the worker ``loop``, the read
``views``). Their order is written once, as the ``controller-layers`` contract in
``.importlinter``; the route of a change is drawn in ``live/__init__.py`` and in the
README's "Inside the controller".
"""
