"""Real processes on loopback for the benches and the tests: ``replicas`` (``gpufed serve``
replica sets), ``alertmanager`` (an Alertmanager HA set and the DingTalk relay) and
``polling`` (wait until a server answers, never a blind sleep)."""
