"""The placement engine, pure: targets and a spec in, an assignment and a plan out.

``assigning`` places from scratch, ``incremental`` moves only what a change touches,
``planning`` diffs two assignments, ``sizing`` picks shard counts, and ``step`` is the
frozen value one placement hands down to commit and publish.
"""
