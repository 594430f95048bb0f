"""exporter-toolkit's web configuration file (``--web.config.file``) for every gpufed server.

``model`` parses and validates it; ``tls`` builds the reloading server ``SSLContext``;
``guard`` answers basic auth, the rate limit and the response headers. ``serving`` ties
them together for one server: ``load_web_config(path)`` -> ``Served``.
"""
