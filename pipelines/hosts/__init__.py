"""KFP hosts: publish compiled pipelines (versions, runs, recurring runs) and check a host's backend release."""
