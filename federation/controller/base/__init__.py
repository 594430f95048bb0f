"""The controller's bottom floors, shared by every wing: operator plans and changes
(``plans``, ``changing``), the state model (``state``, ``audit_bounds``), and what all rooms
use (``metrics``, ``options``, ``errors``, ``shed``, ``target_index``). Nothing here imports
a wing; their order is the ``controller-base`` contract."""
