"""The child Prometheus configs: rendering (``render``), the sharder's part of an output
tree (``tree``), the previous tree's assignment (``previous_state``) and the output lock."""
