"""Local stand-ins for remote services, driven by the real client libraries in tests."""
