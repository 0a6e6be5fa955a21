"""What a KFP backend does with the compiled pipeline, modelled release by release: the driver's pods, the launcher's
artifact copies, and `pipectl compile --explain` built on both."""
