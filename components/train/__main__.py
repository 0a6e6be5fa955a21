"""`python -m components.train`: the step's command line (components/train/cli.py)."""

from components.train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
