"""`python -m carry`: the same CLI as the installed `carry` command and `build.py` (carry/cli/)."""

from carry.cli.main import main

if __name__ == "__main__":
    main()
