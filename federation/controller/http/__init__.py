"""The HTTP edge: the app factory (``api``), thin routes over the controller, its read model
and planner, and the guards in front of them (auth, rate limits, body limits, redaction)."""
