"""A local run (kfp.local): the files it reads checked first, its console and step logs, its run page."""
