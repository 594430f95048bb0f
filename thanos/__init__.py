"""Thanos renderers for the master tier: pure functions from the ``thanos:`` spec section to files.

    models   the typed ``thanos:`` section (rings, query, store, compactor retention guard)
    objstore the typed object store: S3, Aliyun OSS, filesystem; secrets as env/file references
    render   hashrings.json, objstore.yml and each component's arguments, as a bundle
    formats  Thanos' own file formats, parsed strictly: the stand-in for a Thanos binary
    hashring Thanos Receive's ketama/hashmod placement, reproduced for the bench and tests
    bench    ``gpufed bench thanos``: series moved when an ingestor joins

Nothing here runs Thanos or touches the network; ``federation.master.pipeline`` writes the bundle.
"""
