"""`python -m components.predict`: the step's command line (components/predict/cli.py)."""

from components.predict.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
