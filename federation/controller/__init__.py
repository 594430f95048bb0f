"""The live control plane behind ``gpufed serve``.

Layers (enforced in ``.importlinter``): ``state`` (models) < ``handover``, ``sdcache``,
``changes`` (pure logic over the sharder) < ``store``/``sqlite_store``/``probe`` (I/O
behind small protocols) < ``core`` (the ``Controller``: discovery loop, plans, hand-overs)
< ``api`` (thin FastAPI routes) < ``federation.commands.serve``.
"""
