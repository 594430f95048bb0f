"""The Loki stand-in: ``push`` (the push endpoint, checking labels as Loki's distributor
does), ``snappy`` (the block format Promtail sends) and ``relabel`` (Prometheus relabelling
as Promtail applies it)."""
