"""`python -m components.preprocess`: the step's command line (components/preprocess/cli.py)."""

from components.preprocess.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
