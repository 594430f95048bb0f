"""In-process fakes of external services (Consul agent) for tests."""
