"""Several replicas, one writer: leader election (``leader``, ``consul_lock``, ``lease``), what a
replica may write and adopt (``replica``), and serving a stored state at start, at take-over
and as a follower (``adoption``)."""
