"""Local stand-ins for remote services, so tests can drive the real client libraries over HTTP."""
