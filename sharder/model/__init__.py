"""The sharder's data model: the federation spec, the target inventory, and reading them
(``loading``: the one validation layer, errors naming the file, field and value)."""
