"""Real processes and servers on loopback for the benches and the tests: ``replicas``
(``gpufed serve`` replica sets), ``alertmanager`` (an Alertmanager HA set and the DingTalk
relay), ``app_server`` (an ASGI app under uvicorn in a thread, on a bound socket) and
``polling`` (the port a ``gpufed serve --listen 127.0.0.1:0`` bound)."""
